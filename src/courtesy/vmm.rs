//! The CUDA driver's virtual memory calls a Courtesy region needs, each wrapped so that a
//! failure is a value naming the call and the driver's error, never a panic or an abort:
//! physical memory (`create`/`release`), address ranges (`reserve`/`address_free`), their
//! mapping (`map`/`set_access`/`unmap`), pinned host buffers, and the copies, streams and
//! events of a pause or a resume. The driver is loaded at run time (cudarc's
//! `dynamic-loading`): on a machine without libcuda every call is a `Failed`.
//!
//! Every function here is `unsafe` only through the driver's contract on the pointers it is
//! given; the callers (`region`) keep the book of what was created and mapped where.

use std::ffi::c_void;
use std::fmt;
use std::ptr;

use cudarc::driver::sys;

use crate::sources::driver::driver_present;

/// A driver call that did not succeed: which call, and the driver's error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failed {
    pub call: &'static str,
    pub error: String,
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.call, self.error)
    }
}

impl Failed {
    pub fn out_of_memory(&self) -> bool {
        self.error == "CUDA_ERROR_OUT_OF_MEMORY"
    }
}

pub type Result<T> = std::result::Result<T, Failed>;

/// The driver, loaded and initialised; a `Failed` naming `call` when it is not.
fn driver(call: &'static str) -> Result<()> {
    if driver_present() {
        Ok(())
    } else {
        Err(Failed {
            call,
            error: "no CUDA driver (libcuda) on this machine".into(),
        })
    }
}

/// Run one driver call. cudarc panics when the loaded libcuda lacks the symbol (an old
/// driver); that panic must not cross into torch's allocator or Python, so it becomes a
/// `Failed` too.
fn call(name: &'static str, f: impl FnOnce() -> sys::CUresult) -> Result<()> {
    driver(name)?;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(sys::CUresult::CUDA_SUCCESS) => Ok(()),
        Ok(code) => Err(Failed {
            call: name,
            error: format!("{code:?}"),
        }),
        Err(_) => Err(Failed {
            call: name,
            error: "this driver does not have the call (a CUDA driver older than 10.2?)".into(),
        }),
    }
}

fn device_location(device: i32) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device,
    }
}

fn allocation_prop(device: i32) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct whose all-zero value is valid (handle type NONE, no flags);
    // the fields that matter are set below.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location = device_location(device);
    prop
}

/// The size every physical allocation and mapping on `device` is a multiple of.
pub fn granularity(device: i32) -> Result<u64> {
    let prop = allocation_prop(device);
    let mut bytes: usize = 0;
    // SAFETY: `prop` and `bytes` are live locals.
    call("cuMemGetAllocationGranularity", || unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut bytes,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    Ok((bytes as u64).max(1))
}

/// `size` bytes of physical memory on `device` (a multiple of its granularity).
pub fn create(device: i32, size: u64) -> Result<u64> {
    let prop = allocation_prop(device);
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: `prop` and `handle` are live locals.
    call("cuMemCreate", || unsafe {
        sys::cuMemCreate(&mut handle, size as usize, &prop, 0)
    })?;
    Ok(handle)
}

/// Give physical memory back (it must not be mapped any more).
pub fn release(handle: u64) -> Result<()> {
    // SAFETY: the caller created `handle` and unmapped it.
    call("cuMemRelease", || unsafe { sys::cuMemRelease(handle) })
}

/// A range of `size` virtual addresses aligned to `align`, with nothing behind it yet.
pub fn reserve(size: u64, align: u64) -> Result<u64> {
    let mut address: sys::CUdeviceptr = 0;
    // SAFETY: `address` is a live local.
    call("cuMemAddressReserve", || unsafe {
        sys::cuMemAddressReserve(&mut address, size as usize, align as usize, 0, 0)
    })?;
    Ok(address)
}

/// Give a reserved range back (nothing may be mapped in it).
pub fn address_free(address: u64, size: u64) -> Result<()> {
    // SAFETY: the caller reserved exactly this range and unmapped it.
    call("cuMemAddressFree", || unsafe {
        sys::cuMemAddressFree(address, size as usize)
    })
}

/// Put `handle`'s physical memory behind `[address, address + size)` and let `device`
/// read and write it.
pub fn map(address: u64, size: u64, handle: u64, device: i32) -> Result<()> {
    // SAFETY: the range is reserved by the caller and unmapped; `handle` is `size` bytes.
    call("cuMemMap", || unsafe {
        sys::cuMemMap(address, size as usize, 0, handle, 0)
    })?;
    let access = sys::CUmemAccessDesc {
        location: device_location(device),
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: the range was just mapped; `access` is a live local.
    let granted = call("cuMemSetAccess", || unsafe {
        sys::cuMemSetAccess(address, size as usize, &access, 1)
    });
    if granted.is_err() {
        let _ = unmap(address, size);
    }
    granted
}

/// Take the physical memory away from `[address, address + size)`; the range stays
/// reserved.
pub fn unmap(address: u64, size: u64) -> Result<()> {
    // SAFETY: the caller mapped exactly this range and no work uses it any more.
    call("cuMemUnmap", || unsafe {
        sys::cuMemUnmap(address, size as usize)
    })
}

/// `size` bytes of pinned host memory that every context may copy from and to.
pub fn host_alloc(size: u64) -> Result<usize> {
    let mut host: *mut c_void = ptr::null_mut();
    // SAFETY: `host` is a live local.
    call("cuMemHostAlloc", || unsafe {
        sys::cuMemHostAlloc(&mut host, size as usize, sys::CU_MEMHOSTALLOC_PORTABLE)
    })?;
    Ok(host as usize)
}

pub fn free_host(host: usize) -> Result<()> {
    // SAFETY: `host` came from `host_alloc` and no copy uses it any more.
    call("cuMemFreeHost", || unsafe {
        sys::cuMemFreeHost(host as *mut c_void)
    })
}

/// Let this thread make calls that stream capture calls unsafe (pinning host memory)
/// while another thread captures a CUDA graph: in the default ("global") mode such a call
/// from any thread invalidates that capture. The background thread that pins host buffers
/// runs this way; it touches no stream a capture could record.
pub fn relax_capture_mode() -> Result<()> {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: `mode` is a live local; the call changes this thread's mode only.
    call("cuThreadExchangeStreamCaptureMode", || unsafe {
        sys::cuThreadExchangeStreamCaptureMode(&mut mode)
    })
}

/// Device `device`'s primary context (the one torch uses), current on this thread while
/// this lives. Refused when the context is not active: this never creates one.
pub struct Context {
    device: sys::CUdevice,
}

impl Context {
    pub fn enter(ordinal: i32) -> Result<Context> {
        let mut device: sys::CUdevice = 0;
        // SAFETY: out-pointers are live locals.
        call("cuDeviceGet", || unsafe {
            sys::cuDeviceGet(&mut device, ordinal)
        })?;
        let (mut flags, mut active) = (0u32, 0i32);
        call("cuDevicePrimaryCtxGetState", || unsafe {
            sys::cuDevicePrimaryCtxGetState(device, &mut flags, &mut active)
        })?;
        if active == 0 {
            return Err(Failed {
                call: "cuDevicePrimaryCtxGetState",
                error: format!("device {ordinal} has no active CUDA context"),
            });
        }
        let mut context: sys::CUcontext = ptr::null_mut();
        call("cuDevicePrimaryCtxRetain", || unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut context, device)
        })?;
        if let Err(failed) = call("cuCtxPushCurrent", || unsafe {
            sys::cuCtxPushCurrent_v2(context)
        }) {
            let _ = call("cuDevicePrimaryCtxRelease", || unsafe {
                sys::cuDevicePrimaryCtxRelease_v2(device)
            });
            return Err(failed);
        }
        Ok(Context { device })
    }

    /// Wait for all work on the device's context.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: this context is current on this thread while `self` lives.
        call("cuCtxSynchronize", || unsafe { sys::cuCtxSynchronize() })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let mut popped: sys::CUcontext = ptr::null_mut();
        // SAFETY: `enter` pushed the context on this thread and retained it once.
        let _ = call("cuCtxPopCurrent", || unsafe {
            sys::cuCtxPopCurrent_v2(&mut popped)
        });
        let device = self.device;
        let _ = call("cuDevicePrimaryCtxRelease", || unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(device)
        });
    }
}

/// A stream of the current context that does not wait for the legacy default stream.
pub struct Stream(sys::CUstream);

impl Stream {
    pub fn new(_context: &Context) -> Result<Stream> {
        let mut stream: sys::CUstream = ptr::null_mut();
        // SAFETY: a context is current (the borrow says so); `stream` is a live local.
        call("cuStreamCreate", || unsafe {
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            )
        })?;
        Ok(Stream(stream))
    }

    /// Queue a copy of `len` bytes from device memory to pinned host memory.
    ///
    /// # Safety
    /// `device` and `host` are valid for `len` bytes until the stream has run the copy.
    pub unsafe fn copy_to_host(&self, host: usize, device: u64, len: u64) -> Result<()> {
        call("cuMemcpyDtoHAsync", || {
            sys::cuMemcpyDtoHAsync_v2(host as *mut c_void, device, len as usize, self.0)
        })
    }

    /// Queue a copy of `len` bytes from pinned host memory to device memory.
    ///
    /// # Safety
    /// As `copy_to_host`.
    pub unsafe fn copy_to_device(&self, device: u64, host: usize, len: u64) -> Result<()> {
        call("cuMemcpyHtoDAsync", || {
            sys::cuMemcpyHtoDAsync_v2(device, host as *const c_void, len as usize, self.0)
        })
    }

    /// A mark after the work queued so far, to wait for later.
    pub fn mark(&self) -> Result<Event> {
        let mut event: sys::CUevent = ptr::null_mut();
        // SAFETY: `event` is a live local; the stream lives.
        call("cuEventCreate", || unsafe {
            sys::cuEventCreate(
                &mut event,
                sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
            )
        })?;
        let event = Event(event);
        call("cuEventRecord", || unsafe {
            sys::cuEventRecord(event.0, self.0)
        })?;
        Ok(event)
    }

    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the stream lives.
        call("cuStreamSynchronize", || unsafe {
            sys::cuStreamSynchronize(self.0)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created by `new`; the driver lets queued work finish first.
        let _ = call("cuStreamDestroy", || unsafe {
            sys::cuStreamDestroy_v2(self.0)
        });
    }
}

pub struct Event(sys::CUevent);

impl Event {
    pub fn wait(&self) -> Result<()> {
        // SAFETY: the event lives and was recorded.
        call("cuEventSynchronize", || unsafe {
            sys::cuEventSynchronize(self.0)
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by `Stream::mark`.
        let _ = call("cuEventDestroy", || unsafe {
            sys::cuEventDestroy_v2(self.0)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_every_call_is_a_failure_not_a_panic() {
        if driver_present() {
            return; // a GPU machine: the cuda-marked Python tests cover the calls
        }
        let failed = create(0, 2 << 20).unwrap_err();
        assert_eq!(failed.call, "cuMemCreate");
        assert!(failed.to_string().contains("no CUDA driver"), "{failed}");
        assert!(granularity(0).is_err());
        assert!(host_alloc(4096).is_err());
        assert!(Context::enter(0).is_err());
    }
}
