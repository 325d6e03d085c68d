//! Every wire format of hami-rs, as pure functions over plain data.

#[cfg(feature = "json")]
pub mod cu_allocated;
pub mod cu_list;
pub mod device_list;
pub mod identity;
pub mod memory_limit;
pub mod names;
pub mod node_lock;
#[cfg(feature = "json")]
pub mod node_register;
pub mod rfc3339;
