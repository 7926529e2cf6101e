//! The CUDA driver's view of device memory (what nvidia-smi shows), through cudarc with the
//! driver library loaded at run time.
//!
//! Rules: never panic and never create a CUDA context. Without libcuda every query answers
//! None; a device whose primary context is not active yet (torch has not touched it) answers
//! None too, because creating a context costs hundreds of MiB of the user's GPU.
//! Python asks through `sources::py` (`driver_device_memory`, `driver_available`).

use std::ptr;
use std::sync::OnceLock;

use cudarc::driver::sys;

/// Whether the CUDA driver library could be loaded (and initialised) on this machine.
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        // SAFETY: only tries to open the library; a missing library is an Ok(false).
        let present = unsafe { sys::is_culib_present() };
        present && unsafe { sys::cuInit(0) } == sys::CUresult::CUDA_SUCCESS
    })
}

fn check(result: sys::CUresult) -> Option<()> {
    (result == sys::CUresult::CUDA_SUCCESS).then_some(())
}

/// (used, total) bytes on device `ordinal` for all processes, if the driver is present and
/// the device's primary context is already active.
pub fn device_memory(ordinal: i32) -> Option<(u64, u64)> {
    if !driver_present() {
        return None;
    }
    // cudarc panics on a missing symbol; a panic must never cross into Python.
    std::panic::catch_unwind(|| unsafe { query(ordinal) })
        .ok()
        .flatten()
}

/// SAFETY: the driver is loaded and initialised; every out-pointer is a live local.
unsafe fn query(ordinal: i32) -> Option<(u64, u64)> {
    let mut device: sys::CUdevice = 0;
    check(sys::cuDeviceGet(&mut device, ordinal))?;
    let (mut flags, mut active) = (0u32, 0i32);
    check(sys::cuDevicePrimaryCtxGetState(
        device,
        &mut flags,
        &mut active,
    ))?;
    if active == 0 {
        return None;
    }
    let mut context: sys::CUcontext = ptr::null_mut();
    check(sys::cuDevicePrimaryCtxRetain(&mut context, device))?;
    let mut answer = None;
    if check(sys::cuCtxPushCurrent_v2(context)).is_some() {
        let (mut free, mut total) = (0usize, 0usize);
        if check(sys::cuMemGetInfo_v2(&mut free, &mut total)).is_some() {
            answer = Some(((total - free) as u64, total as u64));
        }
        let mut popped: sys::CUcontext = ptr::null_mut();
        sys::cuCtxPopCurrent_v2(&mut popped);
    }
    sys::cuDevicePrimaryCtxRelease_v2(device);
    answer
}

#[cfg(test)]
mod tests {
    #[test]
    fn never_panics_without_a_driver() {
        // On a machine without libcuda this is None; with one, the device may be inactive.
        let _ = super::device_memory(0);
        let _ = super::device_memory(-1);
    }
}
