//! Looks a name up in a loaded object's own dynamic symbol table, reached from its link map
//! (`l_addr`, `l_ld`), without calling into the dynamic linker: safe inside the audit
//! callbacks, which run under the linker's lock. This is how the hook recognises the HIP
//! runtime by what it defines (`hipMalloc`, `hipRuntimeGetVersion`) rather than by its file
//! name (wheels vendor renamed copies such as `libamdhip64-1a2b3c4d.so.5`), and how it finds a
//! given runtime's own functions when two are loaded.

use std::ffi::CStr;

const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_STRSZ: i64 = 10;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;

const STT_OBJECT: u8 = 1;
const STT_FUNC: u8 = 2;
const STB_GLOBAL: u8 = 1;
const STB_WEAK: u8 = 2;
/// `versym` bit of a non-default (hidden) version, e.g. `name@OLD` beside `name@@NEW`.
const VERSYM_HIDDEN: u16 = 0x8000;

#[repr(C)]
struct Dyn {
    tag: i64,
    value: u64,
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

/// The dynamic tables of one loaded object.
#[derive(Debug, Clone, Copy)]
pub struct DynTables {
    base: usize,
    strtab: usize,
    strsz: usize,
    symtab: usize,
    gnu_hash: usize,
    hash: usize,
    versym: usize,
}

impl DynTables {
    /// Reads the dynamic section of an object loaded at `base` (`l_addr`) whose `_DYNAMIC`
    /// is `dynamic` (`l_ld`). `None` when it has no symbol or hash table.
    ///
    /// # Safety
    /// `dynamic` is the `l_ld` of a live link map whose object is mapped at `base`.
    pub unsafe fn read(base: usize, dynamic: *const libc::c_void) -> Option<DynTables> {
        if dynamic.is_null() {
            return None;
        }
        // glibc relocates the pointers of a writable dynamic section in place; a read-only
        // one keeps file offsets. An unrelocated value is far below the load address.
        let at = |value: u64| {
            let value = value as usize;
            if base != 0 && value < base {
                value + base
            } else {
                value
            }
        };
        let mut tables = DynTables {
            base,
            strtab: 0,
            strsz: 0,
            symtab: 0,
            gnu_hash: 0,
            hash: 0,
            versym: 0,
        };
        let mut entry = dynamic.cast::<Dyn>();
        for _ in 0..4096 {
            // SAFETY: the dynamic section is an array of Dyn ending in DT_NULL (bounded here
            // in case it does not).
            let Dyn { tag, value } = unsafe { entry.read() };
            match tag {
                DT_NULL => break,
                DT_STRTAB => tables.strtab = at(value),
                DT_SYMTAB => tables.symtab = at(value),
                DT_STRSZ => tables.strsz = value as usize,
                DT_GNU_HASH => tables.gnu_hash = at(value),
                DT_HASH => tables.hash = at(value),
                DT_VERSYM => tables.versym = at(value),
                _ => {}
            }
            // SAFETY: still inside the array (DT_NULL not reached).
            entry = unsafe { entry.add(1) };
        }
        let usable =
            tables.strtab != 0 && tables.symtab != 0 && (tables.gnu_hash != 0 || tables.hash != 0);
        usable.then_some(tables)
    }

    /// The address of the default version of `name` if this object defines it as a global
    /// function or object (IFUNCs are not taken: their value is a resolver).
    pub fn lookup(&self, name: &[u8]) -> Option<usize> {
        if self.gnu_hash != 0 {
            // SAFETY: the tables come from a live object's dynamic section.
            unsafe { self.lookup_gnu(name) }
        } else {
            // SAFETY: as above.
            unsafe { self.lookup_sysv(name) }
        }
    }

    /// # Safety
    /// The tables are a live object's.
    unsafe fn symbol_matches(&self, index: usize, name: &[u8]) -> Option<usize> {
        let sym = (self.symtab as *const Sym).wrapping_add(index);
        // SAFETY: index comes from the object's hash table, so it is inside its symtab.
        let sym = unsafe { sym.read() };
        let kind = sym.info & 0xf;
        let bind = sym.info >> 4;
        if sym.shndx == 0
            || !(kind == STT_FUNC || kind == STT_OBJECT)
            || !(bind == STB_GLOBAL || bind == STB_WEAK)
            || sym.name as usize >= self.strsz.max(1)
        {
            return None;
        }
        // SAFETY: st_name is an offset into the string table, NUL-terminated.
        let found = unsafe { CStr::from_ptr((self.strtab + sym.name as usize) as *const _) };
        if found.to_bytes() != name {
            return None;
        }
        if self.versym != 0 {
            // SAFETY: versym has one u16 per symbol.
            let version = unsafe { (self.versym as *const u16).add(index).read() };
            if version & VERSYM_HIDDEN != 0 {
                return None;
            }
        }
        Some(self.base + sym.value as usize)
    }

    /// # Safety
    /// The tables are a live object's.
    unsafe fn lookup_gnu(&self, name: &[u8]) -> Option<usize> {
        let table = self.gnu_hash as *const u32;
        // SAFETY: DT_GNU_HASH starts with nbuckets, symoffset, bloom_size, bloom_shift.
        let (nbuckets, symoffset, bloom_size) =
            unsafe { (table.read(), table.add(1).read(), table.add(2).read()) };
        if nbuckets == 0 {
            return None;
        }
        let hash = gnu_hash(name);
        // SAFETY: the buckets follow the 64-bit bloom words.
        let buckets = unsafe { table.add(4).cast::<u64>().add(bloom_size as usize) }.cast::<u32>();
        // SAFETY: hash % nbuckets is inside the bucket array.
        let first = unsafe { buckets.add((hash % nbuckets) as usize).read() };
        if first < symoffset {
            return None;
        }
        // SAFETY: the chain array follows the buckets.
        let chain = unsafe { buckets.add(nbuckets as usize) };
        // Bounded in case the chain's end bit is missing.
        for index in (first..).take(1 << 20) {
            // SAFETY: chain entries exist for every symbol from symoffset on, and the walk
            // stops at the entry with the low bit set.
            let value = unsafe { chain.add((index - symoffset) as usize).read() };
            if (value | 1) == (hash | 1)
                // SAFETY: index is a symbol of this object.
                && let Some(address) = unsafe { self.symbol_matches(index as usize, name) }
            {
                return Some(address);
            }
            if value & 1 != 0 {
                break;
            }
        }
        None
    }

    /// # Safety
    /// The tables are a live object's.
    unsafe fn lookup_sysv(&self, name: &[u8]) -> Option<usize> {
        let table = self.hash as *const u32;
        // SAFETY: DT_HASH starts with nbucket, nchain.
        let (nbucket, nchain) = unsafe { (table.read(), table.add(1).read()) };
        if nbucket == 0 {
            return None;
        }
        let buckets = table.wrapping_add(2);
        let chains = buckets.wrapping_add(nbucket as usize);
        // SAFETY: inside the bucket array.
        let mut index = unsafe { buckets.add((sysv_hash(name) % nbucket) as usize).read() };
        let mut steps = 0;
        while index != 0 && index < nchain && steps < nchain {
            // SAFETY: index < nchain is a symbol of this object.
            if let Some(address) = unsafe { self.symbol_matches(index as usize, name) } {
                return Some(address);
            }
            // SAFETY: index < nchain.
            index = unsafe { chains.add(index as usize).read() };
            steps += 1;
        }
        None
    }
}

fn gnu_hash(name: &[u8]) -> u32 {
    name.iter().fold(5381u32, |h, b| {
        h.wrapping_mul(33).wrapping_add(u32::from(*b))
    })
}

fn sysv_hash(name: &[u8]) -> u32 {
    let mut h: u32 = 0;
    for b in name {
        h = (h << 4).wrapping_add(u32::from(*b));
        let g = h & 0xf000_0000;
        if g != 0 {
            h ^= g >> 24;
        }
        h &= !g;
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::LinkMap;

    #[test]
    fn hashes_match_the_elf_specification() {
        assert_eq!(gnu_hash(b""), 5381);
        assert_eq!(gnu_hash(b"printf"), 0x156b_2bb8);
        assert_eq!(sysv_hash(b"printf"), 0x077905a6);
    }

    #[test]
    fn finds_what_libc_defines_as_dlsym_does() {
        // glibc's dlopen handle is the object's link map.
        // SAFETY: RTLD_NOLOAD of the already loaded libc; the handle stays valid.
        let handle =
            unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        assert!(!handle.is_null());
        let map = handle.cast::<LinkMap>();
        // SAFETY: a live link map.
        let tables = unsafe { DynTables::read((*map).l_addr, (*map).l_ld) }.unwrap();
        for name in [c"getpid", c"malloc", c"environ", c"getenv"] {
            // SAFETY: dlsym on a live handle.
            let expected = unsafe { libc::dlsym(handle, name.as_ptr()) } as usize;
            assert_eq!(tables.lookup(name.to_bytes()), Some(expected), "{name:?}");
        }
        assert_eq!(tables.lookup(b"hipMalloc"), None);
        assert_eq!(tables.lookup(b"no_such_symbol_anywhere"), None);
    }
}
