//! Helper process for the region's SIGKILL tests: attaches to a region, then either holds a
//! device's accounting lock or owns bytes, says "ready" on stdout and waits to be killed.
//!
//! `region_holder <path> hold-lock <device>` | `region_holder <path> own-bytes <device> <bytes>`
//! | `region_holder <path> hold-flock 0` (holds the claim/reclaim flock, as a process killed
//! in the middle of attaching would).

use std::io::Write;
use std::path::Path;

use hami_region::{Limits, Session};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: region_holder <path> (hold-lock <device> | own-bytes <device> <bytes>)";
    let (Some(path), Some(action), Some(device)) = (args.get(1), args.get(2), args.get(3)) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let device: usize = device.parse().unwrap_or_else(|_| {
        eprintln!("{usage}");
        std::process::exit(2)
    });
    if action == "hold-flock" {
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .unwrap_or_else(|err| {
                eprintln!("region_holder: {err}");
                std::process::exit(1)
            });
        if let Err(err) = file.lock() {
            eprintln!("region_holder: {err}");
            std::process::exit(1);
        }
        println!("ready");
        let _ = std::io::stdout().flush();
        loop {
            std::thread::park();
        }
    }
    let session = Session::attach(Path::new(path), &Limits::default()).unwrap_or_else(|err| {
        eprintln!("region_holder: {err}");
        std::process::exit(1)
    });
    let _held = match action.as_str() {
        "hold-lock" => {
            // Own some bytes too, so the test sees them come back after the lock is taken over.
            let _ = session.reserve(device, 1000);
            session.lock_device(device)
        }
        "own-bytes" => {
            let bytes: u64 = args.get(4).and_then(|b| b.parse().ok()).unwrap_or(0);
            if let Err(err) = session.reserve(device, bytes) {
                eprintln!("region_holder: {err}");
                std::process::exit(1);
            }
            None
        }
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    println!("ready {}", session.slot_index());
    let _ = std::io::stdout().flush();
    loop {
        std::thread::park();
    }
}
