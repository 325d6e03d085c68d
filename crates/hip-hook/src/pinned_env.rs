//! Variables that define the slice (`HSA_CU_MASK`, `ROC_GLOBAL_CU_MASK`, `AMD_TASK_PRIORITY`,
//! `HIP_OVERSUBSCRIBE`) are pinned: when the HIP runtime reads them through `getenv`, it gets
//! the pod spec's value (pid 1's environment), else the process's value at start-up — never a
//! value the application `setenv`-ed later, so it cannot widen its slice.

use std::ffi::{CStr, CString};
use std::sync::OnceLock;

pub const PINNED: [&str; 4] = [
    "HSA_CU_MASK",
    "ROC_GLOBAL_CU_MASK",
    "AMD_TASK_PRIORITY",
    "HIP_OVERSUBSCRIBE",
];

/// The pinned value of each name in [`PINNED`], `None` when unset in both sources.
pub fn pinned_values(
    pod: &dyn Fn(&str) -> Option<String>,
    own: &dyn Fn(&str) -> Option<String>,
) -> [Option<String>; 4] {
    PINNED.map(|name| pod(name).or_else(|| own(name)))
}

/// Which pinned name `name` is.
pub fn pinned_index(name: &[u8]) -> Option<usize> {
    PINNED.iter().position(|p| p.as_bytes() == name)
}

static VALUES: OnceLock<[Option<CString>; 4]> = OnceLock::new();

/// The C string `getenv` should return for pinned variable `index` (NULL when unset). The
/// strings live for the process's life, as `getenv`'s do.
pub fn pinned_c_value(index: usize) -> *const libc::c_char {
    let values = VALUES.get_or_init(|| {
        let pod = crate::environ::pod_environ();
        let from_pod = |key: &str| {
            pod.as_deref()
                .and_then(|pairs| crate::environ::lookup(pairs, key))
                .map(str::to_owned)
        };
        let own = |key: &str| std::env::var(key).ok();
        pinned_values(&from_pod, &own).map(|value| value.and_then(|v| CString::new(v).ok()))
    });
    values
        .get(index)
        .and_then(Option::as_ref)
        .map_or(std::ptr::null(), |value| CStr::as_ptr(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_value_then_start_up_value() {
        let pod = |key: &str| (key == "HSA_CU_MASK").then(|| "0:0-3".to_owned());
        let own = |key: &str| match key {
            "HSA_CU_MASK" => Some("0:0-63".to_owned()),
            "AMD_TASK_PRIORITY" => Some("2".to_owned()),
            _ => None,
        };
        let values = pinned_values(&pod, &own);
        assert_eq!(values[0].as_deref(), Some("0:0-3"));
        assert_eq!(values[2].as_deref(), Some("2"));
        assert_eq!(values[1], None);
        assert_eq!(pinned_index(b"HSA_CU_MASK"), Some(0));
        assert_eq!(pinned_index(b"HSA_CU_MASKX"), None);
    }
}
