//! Sets the real runtime's SONAME, so programs linked against this file record
//! `libamdhip64.so.6` exactly as they do against ROCm.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libamdhip64.so.6");
}
