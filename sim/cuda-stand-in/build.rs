//! Sets the real driver's SONAME, so programs linked against this file record
//! `libcuda.so.1` exactly as they do against the NVIDIA driver.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
