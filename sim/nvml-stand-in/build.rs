//! Sets the stand-in's SONAME. Rust library names cannot contain '-': the file is
//! libnvidia_ml.so, its SONAME the real library's, `libnvidia-ml.so.1`. Tests and users link
//! it under that name (README.md).

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}
