//! Variables that define the slice (`HSA_CU_MASK`, `ROC_GLOBAL_CU_MASK`, `AMD_TASK_PRIORITY`,
//! `HIP_OVERSUBSCRIBE`) are pinned to the plugin's config file, else the pod spec's value
//! (pid 1's environment), else the process's value at start-up — never a value the
//! application set later, so it cannot widen its slice. Three mechanisms, because the
//! runtime reads them two ways:
//! - ROCr reads through `getenv`: its `getenv` binding is redirected to [`pinned_c_value`];
//! - HIP's flag parser (rocclr) **walks `environ`**: before the program's constructors run
//!   (`la_preinit`) the hook rewrites the process's `environ` so it holds exactly the pinned
//!   values ([`apply_to_environ`]);
//! - the application's `setenv`/`putenv`/`unsetenv`/`clearenv` (bound through the PLT or
//!   `dlsym`) leave pinned names as they are ([`is_pinned_assignment`]; `clearenv` puts the
//!   pinned values back).

use std::ffi::{CStr, CString};
use std::sync::OnceLock;

/// The variables the hook keeps at the pod spec's value for the runtime and the application.
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

/// The pinned values from the plugin's config file: what it names, and nothing else (a
/// variable it leaves out is unset for the runtime, whatever the environment says) — except
/// `AMD_TASK_PRIORITY`, the user's own choice (SPEC §2.6), not part of the slice: the plugin
/// pins it from the container's spec when the spec gives a plain value; where it does not
/// (`valueFrom`, `envFrom`, or a DRA claim's config, which no container spec reaches), the
/// value this process started with (`own`) is kept, never pid 1's (the pause container under
/// `shareProcessNamespace`).
pub fn values_from_file(
    file: &hami_protocol::hook_config::HookConfig,
    own: &dyn Fn(&str) -> Option<String>,
) -> [Option<String>; 4] {
    PINNED.map(|name| match name {
        "HSA_CU_MASK" => file.hsa_cu_mask.clone(),
        "ROC_GLOBAL_CU_MASK" => file.roc_global_cu_mask.clone(),
        "AMD_TASK_PRIORITY" => file.pinned.get(name).cloned().or_else(|| own(name)),
        other => file.pinned.get(other).cloned(),
    })
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
        let values = match crate::hook_config_file::source() {
            crate::hook_config_file::Source::File { config, .. } => values_from_file(config, &own),
            _ => pinned_values(&from_pod, &own),
        };
        values.map(|value| value.and_then(|v| CString::new(v).ok()))
    });
    values
        .get(index)
        .and_then(Option::as_ref)
        .map_or(std::ptr::null(), |value| CStr::as_ptr(value))
}

/// Whether `entry` (`NAME` or `NAME=value`, as `setenv`/`unsetenv`/`putenv` receive) names a
/// pinned variable.
pub fn is_pinned_assignment(entry: &[u8]) -> bool {
    let name = entry.split(|b| *b == b'=').next().unwrap_or(entry);
    pinned_index(name).is_some()
}

/// The process's environment with the pinned variables replaced: every entry whose name is
/// not pinned, in order, then the pinned assignments. `T` is what the caller keeps of an
/// entry (a `char *` for the live `environ`, bytes in tests).
pub fn rewritten<'a, T: Copy + 'a>(
    entries: impl IntoIterator<Item = (T, &'a [u8])>,
    pinned: impl IntoIterator<Item = T>,
) -> Vec<T> {
    let mut out: Vec<T> = entries
        .into_iter()
        .filter(|(_, text)| !is_pinned_assignment(text))
        .map(|(entry, _)| entry)
        .collect();
    out.extend(pinned);
    out
}

static VALUE_STRINGS: OnceLock<Vec<CString>> = OnceLock::new();

/// The `NAME=value` strings of the pinned values, alive for the process's life.
fn assignments() -> &'static [CString] {
    VALUE_STRINGS.get_or_init(|| {
        PINNED
            .iter()
            .enumerate()
            .filter_map(|(index, name)| {
                let value = pinned_c_value(index);
                if value.is_null() {
                    return None;
                }
                // SAFETY: a non-null value from pinned_c_value is a live NUL-terminated string.
                let value = unsafe { CStr::from_ptr(value) }.to_bytes();
                let mut entry = format!("{name}=").into_bytes();
                entry.extend_from_slice(value);
                CString::new(entry).ok()
            })
            .collect()
    })
}

/// The address of the `environ` variable every object of the process uses: the program's
/// own copy if it has one (a copy relocation), else libc's.
fn environ_variable() -> Option<*mut *mut *mut libc::c_char> {
    use std::sync::atomic::Ordering::Relaxed;
    let main = crate::symbols::MAIN_PROGRAM.load(Relaxed);
    let libc = crate::symbols::LIBC.load(Relaxed);
    // SAFETY: the program's and libc's link maps from la_objopen: loaded for the process's life.
    unsafe { crate::symbols::lookup_in(main, "environ") }
        // SAFETY: as above.
        .or_else(|| unsafe { crate::symbols::lookup_in(libc, "environ") })
        .map(|address| address as *mut *mut *mut libc::c_char)
}

/// Rewrites the process's `environ` so that it holds exactly the pinned values. The new
/// array and its added strings are leaked (libc never frees an array it did not allocate).
///
/// # Safety
/// No other thread reads or changes the environment meanwhile: called before any of the
/// application's code runs (`la_preinit`) or inside the application's own `clearenv`, which
/// libc already requires to be free of concurrent environment use.
pub unsafe fn apply_to_environ() {
    let Some(variable) = environ_variable() else {
        crate::log::error(format_args!(
            "cannot find the process's environ: HSA_CU_MASK and the other pinned variables are enforced only for getenv readers"
        ));
        return;
    };
    let added = assignments();
    // SAFETY: `variable` is the address of the process's `environ` (a `char **`), read and
    // written before any application code runs (la_preinit) or under the caller's own use
    // of the environment (clearenv), as libc's own functions do.
    unsafe {
        let old = *variable;
        let mut current: Vec<(*mut libc::c_char, &[u8])> = Vec::new();
        let mut cursor = old;
        while !cursor.is_null() && !(*cursor).is_null() {
            current.push((*cursor, CStr::from_ptr(*cursor).to_bytes()));
            cursor = cursor.add(1);
        }
        let mut entries = rewritten(current, added.iter().map(|e| e.as_ptr().cast_mut()));
        entries.push(std::ptr::null_mut());
        let array = Box::leak(entries.into_boxed_slice());
        *variable = array.as_mut_ptr();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_is_rewritten_to_the_pinned_values() {
        let entries: [&[u8]; 4] = [
            b"PATH=/bin",
            b"HSA_CU_MASK=0:0-63",
            b"ROC_GLOBAL_CU_MASK",
            b"X=1",
        ];
        let pinned: [&[u8]; 2] = [b"HSA_CU_MASK=0:0-3", b"HIP_OVERSUBSCRIBE=true"];
        let out = rewritten(entries.iter().map(|e| (*e, *e)), pinned);
        assert_eq!(
            out,
            [
                &b"PATH=/bin"[..],
                b"X=1",
                b"HSA_CU_MASK=0:0-3",
                b"HIP_OVERSUBSCRIBE=true"
            ]
        );
        assert!(is_pinned_assignment(b"ROC_GLOBAL_CU_MASK=0xff"));
        assert!(is_pinned_assignment(b"AMD_TASK_PRIORITY"));
        assert!(!is_pinned_assignment(b"HSA_CU_MASKS=1"));
    }

    #[test]
    fn the_config_decides_but_the_task_priority_falls_back_to_the_start_up_value() {
        let own = |key: &str| match key {
            "HSA_CU_MASK" => Some("0:0-63".to_owned()),
            "HIP_OVERSUBSCRIBE" => Some("1".to_owned()),
            "AMD_TASK_PRIORITY" => Some("2".to_owned()),
            _ => None,
        };
        let mut file = hami_protocol::hook_config::HookConfig {
            hsa_cu_mask: Some("0:0-3".into()),
            ..Default::default()
        };
        let values = values_from_file(&file, &own);
        assert_eq!(values[0].as_deref(), Some("0:0-3"));
        assert_eq!(values[1], None);
        assert_eq!(
            values[2].as_deref(),
            Some("2"),
            "not in the config: start-up value"
        );
        assert_eq!(values[3], None, "HIP_OVERSUBSCRIBE only from the config");
        file.pinned.insert("AMD_TASK_PRIORITY".into(), "0".into());
        assert_eq!(values_from_file(&file, &own)[2].as_deref(), Some("0"));
    }

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
