//! What the stand-in pretends to be, from its environment.

use hami_protocol::memory_limit::parse_memory_limit;

/// The stand-in's devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `FAKE_HIP_DEVICE_COUNT`, default 1, at most 64.
    pub device_count: usize,
    /// `FAKE_HIP_DEVICE_MEMORY` per device (SPEC §2.7 strings), default 16g.
    pub device_memory: u64,
    /// `FAKE_HIP_CU_COUNT` compute units per device, default 64.
    pub cu_count: u32,
    /// `FAKE_HIP_SHARED_STATE`: a file holding per-device usage shared by every process that
    /// names it, like a physical device is; unset = this process only.
    pub shared_state: Option<std::path::PathBuf>,
    /// `FAKE_HIP_RUNTIME_VERSION`: what `hipRuntimeGetVersion` reports, default 60000000
    /// (ROCm 6.0); below 60000000 `hipMemCreate` reads ROCm 5's `hipMemAllocationProp`.
    pub runtime_version: i32,
    /// `FAKE_HIP_BLOCK_NS`: device time of one thread block of a launched kernel, default
    /// 1000 ns (a kernel of 1000 blocks keeps the device busy 1 ms).
    pub block_ns: u64,
    /// `FAKE_AMDGPU_DRIVER_SOCKET`: the stand-in amdgpu kernel driver's socket (see
    /// `drm_client.rs`); with it the devices are the container's `/dev/dri/renderD*` nodes.
    pub driver_socket: Option<std::path::PathBuf>,
}

/// Most devices the stand-in models (the hook's region holds 64).
pub const MAX_DEVICES: usize = 64;

impl Config {
    /// Reads the configuration through `lookup` (the environment in production).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let device_count = match lookup("FAKE_HIP_DEVICE_COUNT") {
            None => 1,
            Some(text) => match text.trim().parse::<usize>() {
                Ok(n) if n <= MAX_DEVICES => n,
                _ => {
                    return Err(format!(
                        "FAKE_HIP_DEVICE_COUNT={text:?}: write a number of devices from 0 to {MAX_DEVICES}"
                    ));
                }
            },
        };
        let device_memory = match lookup("FAKE_HIP_DEVICE_MEMORY") {
            None => 16 << 30,
            Some(text) => {
                parse_memory_limit(&text).map_err(|err| format!("FAKE_HIP_DEVICE_MEMORY: {err}"))?
            }
        };
        let cu_count = match lookup("FAKE_HIP_CU_COUNT") {
            None => 64,
            Some(text) => match text.trim().parse::<u32>() {
                Ok(n) if (1..=1024).contains(&n) => n,
                _ => {
                    return Err(format!(
                        "FAKE_HIP_CU_COUNT={text:?}: write a number of compute units from 1 to 1024"
                    ));
                }
            },
        };
        let shared_state = lookup("FAKE_HIP_SHARED_STATE")
            .filter(|p| !p.is_empty())
            .map(Into::into);
        let runtime_version = match lookup("FAKE_HIP_RUNTIME_VERSION") {
            None => 60_000_000,
            Some(text) => match text.trim().parse::<i32>() {
                Ok(n) if n >= 50_100_000 => n,
                _ => {
                    return Err(format!(
                        "FAKE_HIP_RUNTIME_VERSION={text:?}: write a HIP version number of 5.1 or later, e.g. 50221153"
                    ));
                }
            },
        };
        let block_ns = match lookup("FAKE_HIP_BLOCK_NS") {
            None => 1000,
            Some(text) => match text.trim().parse::<u64>() {
                Ok(n) if (1..=1_000_000_000).contains(&n) => n,
                _ => {
                    return Err(format!(
                        "FAKE_HIP_BLOCK_NS={text:?}: write the nanoseconds one thread block takes, from 1 to 1000000000"
                    ));
                }
            },
        };
        let driver_socket = lookup("FAKE_AMDGPU_DRIVER_SOCKET")
            .filter(|p| !p.is_empty())
            .map(Into::into);
        Ok(Config {
            block_ns,
            driver_socket,
            runtime_version,
            device_count,
            device_memory,
            cu_count,
            shared_state,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |key| {
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn defaults_to_one_16g_device() {
        let config = Config::from_lookup(lookup(&[])).unwrap();
        assert_eq!((config.device_count, config.device_memory), (1, 16 << 30));
        assert_eq!(config.shared_state, None);
    }

    #[test]
    fn reads_counts_and_suffixed_sizes() {
        let config = Config::from_lookup(lookup(&[
            ("FAKE_HIP_DEVICE_COUNT", "4"),
            ("FAKE_HIP_DEVICE_MEMORY", "512Mi"),
            ("FAKE_HIP_CU_COUNT", "304"),
        ]))
        .unwrap();
        assert_eq!(
            (config.device_count, config.device_memory, config.cu_count),
            (4, 512 << 20, 304)
        );
    }

    #[test]
    fn bad_values_say_what_to_write() {
        let err = Config::from_lookup(lookup(&[("FAKE_HIP_DEVICE_COUNT", "65")])).unwrap_err();
        assert!(err.contains("0 to 64"), "{err}");
        let err = Config::from_lookup(lookup(&[("FAKE_HIP_DEVICE_MEMORY", "16t")])).unwrap_err();
        assert!(err.contains("4096m"), "{err}");
        let err = Config::from_lookup(lookup(&[("FAKE_HIP_RUNTIME_VERSION", "5.2")])).unwrap_err();
        assert!(err.contains("50221153"), "{err}");
        let err = Config::from_lookup(lookup(&[("FAKE_HIP_CU_COUNT", "0")])).unwrap_err();
        assert!(err.contains("1 to 1024"), "{err}");
        let err = Config::from_lookup(lookup(&[("FAKE_HIP_BLOCK_NS", "0")])).unwrap_err();
        assert!(err.contains("nanoseconds"), "{err}");
    }
}
