//! Finding and rewriting one shared library's GOT slots for named functions (ELF, Linux,
//! x86-64 and aarch64): how `libc10.so`'s calls to `posix_memalign` and `free` reach us.
//!
//! A call from a shared library to a function of another goes through its Global Offset
//! Table: `call posix_memalign@plt` jumps through the slot the dynamic linker filled for that
//! symbol (a `JUMP_SLOT` relocation), and taking the function's address reads a `GLOB_DAT`
//! slot. Writing our function's address into those slots redirects exactly that library's
//! calls, and writing the old value back undoes it. memray interposes `malloc` the same way.
//!
//! The slots are found from the library's own dynamic section, as the dynamic linker found
//! them: the relocation tables (`DT_JMPREL`, `DT_RELA`), the symbol table and its strings.
//! Nothing is guessed from offsets; a library without those tables, or on a platform this
//! module does not know, is refused with the reason.
//!
//! Slots inside the RELRO segment are read-only after loading: a write makes the page
//! writable, writes one aligned word (other threads calling through the slot see the old or
//! the new address, never a mix) and makes it read-only again.

use std::path::Path;

/// One GOT slot for a named function.
#[derive(Clone, Copy, Debug)]
pub struct Slot {
    pub name: &'static str,
    pub address: usize,
    /// Inside the RELRO segment: read-only except while we write it.
    pub relro: bool,
}

/// A loaded library: its load address, the memory its segments occupy, and its slots.
#[derive(Debug)]
pub struct Library {
    pub path: String,
    pub slots: Vec<Slot>,
    /// [start, end) of each loaded segment: a slot value inside one points into the library
    /// itself (a lazy-binding stub that has not resolved the symbol yet).
    pub segments: Vec<(usize, usize)>,
}

impl Library {
    pub fn contains(&self, address: usize) -> bool {
        self.segments
            .iter()
            .any(|&(start, end)| (start..end).contains(&address))
    }
}

/// Read a slot's current value.
///
/// # Safety
/// `slot` must come from `find` for a library that is still loaded (torch's libraries are
/// never unloaded).
pub unsafe fn read(slot: &Slot) -> usize {
    // SAFETY: the slot is an aligned word of the library's GOT (found from its relocation
    // table), mapped readable while the library is loaded; volatile: the dynamic linker or
    // another tool may change it behind our back.
    std::ptr::read_volatile(slot.address as *const usize)
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod elf {
    use super::{Library, Path, Slot};
    use std::ffi::{c_int, c_void, CStr};

    #[cfg(target_arch = "x86_64")]
    const GLOB_DAT: u32 = 6;
    #[cfg(target_arch = "x86_64")]
    const JUMP_SLOT: u32 = 7;
    #[cfg(target_arch = "aarch64")]
    const GLOB_DAT: u32 = 1025;
    #[cfg(target_arch = "aarch64")]
    const JUMP_SLOT: u32 = 1026;

    const DT_NULL: i64 = 0;
    const DT_PLTRELSZ: i64 = 2;
    const DT_STRTAB: i64 = 5;
    const DT_SYMTAB: i64 = 6;
    const DT_RELA: i64 = 7;
    const DT_RELASZ: i64 = 8;
    const DT_STRSZ: i64 = 10;
    const DT_PLTREL: i64 = 20;
    const DT_JMPREL: i64 = 23;
    const DT_RELA_TAG: u64 = 7;

    #[repr(C)]
    struct Dyn {
        tag: i64,
        value: u64,
    }

    #[repr(C)]
    struct Rela {
        offset: u64,
        info: u64,
        addend: i64,
    }

    #[repr(C)]
    struct Sym {
        name: u32,
        info: u8,
        other: u8,
        shndx: u16,
        value: u64,
        size: u64,
    }

    struct Found {
        want: std::path::PathBuf,
        base: usize,
        dynamic: usize,
        relro: Option<(usize, usize)>,
        segments: Vec<(usize, usize)>,
        seen: bool,
    }

    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `Found` that `find` passed to dl_iterate_phdr, alive and not
        // otherwise borrowed during the call; `info` is valid for this callback.
        let found = &mut *(data as *mut Found);
        let info = &*info;
        if info.dlpi_name.is_null() {
            return 0;
        }
        let name = CStr::from_ptr(info.dlpi_name)
            .to_string_lossy()
            .into_owned();
        if name.is_empty() {
            return 0;
        }
        let same = std::fs::canonicalize(&name).is_ok_and(|path| path == found.want);
        if !same {
            return 0;
        }
        found.seen = true;
        found.base = info.dlpi_addr as usize;
        let page = page_size();
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: dl_iterate_phdr gives `dlpi_phnum` program headers at `dlpi_phdr`.
            let header = &*info.dlpi_phdr.add(i);
            let start = found.base + header.p_vaddr as usize;
            let end = start + header.p_memsz as usize;
            match header.p_type {
                libc::PT_LOAD => found.segments.push((start, end)),
                libc::PT_DYNAMIC => found.dynamic = start,
                libc::PT_GNU_RELRO => {
                    // The loader protects whole pages: the start rounded down, the end too.
                    found.relro = Some((start & !(page - 1), end & !(page - 1)));
                }
                _ => {}
            }
        }
        1
    }

    pub fn page_size() -> usize {
        // SAFETY: sysconf has no preconditions.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if size > 0 {
            size as usize
        } else {
            4096
        }
    }

    pub fn find(path: &Path, names: &[&'static str]) -> Result<Library, String> {
        let want = std::fs::canonicalize(path)
            .map_err(|error| format!("{} cannot be read: {error}", path.display()))?;
        let mut found = Found {
            want,
            base: 0,
            dynamic: 0,
            relro: None,
            segments: Vec::new(),
            seen: false,
        };
        // SAFETY: `visit` only reads what the loader hands it and writes `found`, which
        // outlives the call.
        unsafe {
            libc::dl_iterate_phdr(Some(visit), &mut found as *mut Found as *mut c_void);
        }
        if !found.seen {
            return Err(format!("{} is not loaded in this process", path.display()));
        }
        if found.dynamic == 0 {
            return Err(format!("{} has no dynamic section", path.display()));
        }
        // SAFETY: the dynamic section of a loaded library, read entry by entry up to its
        // DT_NULL terminator; the tables it points to are mapped while the library is.
        let slots = unsafe { slots_of(&found, names)? };
        Ok(Library {
            path: path.display().to_string(),
            slots,
            segments: found.segments,
        })
    }

    /// # Safety
    /// `found` describes a library loaded in this process.
    unsafe fn slots_of(found: &Found, names: &[&'static str]) -> Result<Vec<Slot>, String> {
        let (mut strtab, mut strsz, mut symtab) = (0usize, 0usize, 0usize);
        let (mut rela, mut relasz, mut jmprel, mut pltrelsz) = (0usize, 0usize, 0usize, 0usize);
        let mut pltrel = DT_RELA_TAG;
        let mut entry = found.dynamic as *const Dyn;
        // glibc rewrites the pointers of the dynamic section to absolute addresses when it
        // loads a library, musl does not: a value below the load address is relative.
        let absolute = |value: u64| -> usize {
            let value = value as usize;
            if value < found.base {
                found.base + value
            } else {
                value
            }
        };
        loop {
            let dynamic = &*entry;
            let value = dynamic.value;
            match dynamic.tag {
                DT_NULL => break,
                DT_STRTAB => strtab = absolute(value),
                DT_STRSZ => strsz = value as usize,
                DT_SYMTAB => symtab = absolute(value),
                DT_RELA => rela = absolute(value),
                DT_RELASZ => relasz = value as usize,
                DT_JMPREL => jmprel = absolute(value),
                DT_PLTRELSZ => pltrelsz = value as usize,
                DT_PLTREL => pltrel = value,
                _ => {}
            }
            entry = entry.add(1);
        }
        if strtab == 0 || symtab == 0 {
            return Err("the library has no dynamic symbol table".to_string());
        }
        if pltrel != DT_RELA_TAG && jmprel != 0 {
            return Err("the library's PLT relocations are not RELA".to_string());
        }
        let mut slots = Vec::new();
        for (table, size) in [(rela, relasz), (jmprel, pltrelsz)] {
            if table == 0 {
                continue;
            }
            let count = size / std::mem::size_of::<Rela>();
            for i in 0..count {
                let reloc = &*(table as *const Rela).add(i);
                let kind = (reloc.info & 0xffff_ffff) as u32;
                if kind != JUMP_SLOT && kind != GLOB_DAT {
                    continue;
                }
                let symbol = &*(symtab as *const Sym).add((reloc.info >> 32) as usize);
                let at = symbol.name as usize;
                if strsz != 0 && at >= strsz {
                    continue;
                }
                let name = CStr::from_ptr((strtab + at) as *const libc::c_char);
                let Some(&wanted) = names.iter().find(|n| n.as_bytes() == name.to_bytes()) else {
                    continue;
                };
                let address = found.base + reloc.offset as usize;
                let relro = found
                    .relro
                    .is_some_and(|(start, end)| (start..end).contains(&address));
                slots.push(Slot {
                    name: wanted,
                    address,
                    relro,
                });
            }
        }
        Ok(slots)
    }

    /// Write `value` into `slot`.
    ///
    /// # Safety
    /// `slot` comes from `find` for a loaded library, and `value` is the address of a
    /// function with the slot's signature.
    pub unsafe fn write(slot: &Slot, value: usize) -> Result<(), String> {
        let page = page_size();
        let start = slot.address & !(page - 1);
        // SAFETY (mprotect): the page holds the slot and belongs to the library's loaded
        // image. It stays readable throughout, so threads reading the GOT never fault.
        if libc::mprotect(
            start as *mut c_void,
            page,
            libc::PROT_READ | libc::PROT_WRITE,
        ) != 0
        {
            return Err(format!(
                "the GOT page cannot be made writable: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: an aligned word store; a concurrent call sees the old or the new address.
        std::ptr::write_volatile(slot.address as *mut usize, value);
        if slot.relro && libc::mprotect(start as *mut c_void, page, libc::PROT_READ) != 0 {
            return Err(format!(
                "the GOT page cannot be made read-only again: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    /// The address the dynamic linker gives `name` for a library that has not resolved it.
    pub fn resolve(name: &str) -> usize {
        let Ok(name) = std::ffi::CString::new(name) else {
            return 0;
        };
        // SAFETY: dlsym with a NUL-terminated name; RTLD_DEFAULT searches the global scope,
        // where lazy binding would find the symbol for the library.
        unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize }
    }
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
pub use elf::{find, resolve, write};

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
pub fn find(_path: &Path, _names: &[&'static str]) -> Result<Library, String> {
    Err("rewriting a library's GOT is implemented for Linux on x86-64 and aarch64 only".into())
}

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
pub fn resolve(_name: &str) -> usize {
    0
}

/// # Safety
/// Never called: `find` returns no slot on this platform.
#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
pub unsafe fn write(_slot: &Slot, _value: usize) -> Result<(), String> {
    Err("not supported on this platform".into())
}
