//! NVML through `dlopen`: the binding lives in `hami-nvml` (shared with the monitor's host
//! metrics); re-exported here so the plugin's paths stay `crate::nvml::…`.

pub use hami_nvml::*;
