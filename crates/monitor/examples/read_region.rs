//! Prints what the monitor reads from one HAMi-core region file (used by gpu-check/run.sh):
//! `cargo run --release -p hami-monitor --example read_region -- FILE`.

fn main() -> std::process::ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: read_region FILE");
        return std::process::ExitCode::from(2);
    };
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("cannot read {path}: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    let alive = |pid: i32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    match hami_monitor::hami_core_region::read_region(&bytes, &alive) {
        Ok(reading) => {
            println!(
                "layout={} version={}.{} live_processes={}",
                reading.layout, reading.major, reading.minor, reading.live_processes
            );
            for d in &reading.devices {
                println!(
                    "device={} uuid={} limit={} used={} sm_util_sum={}",
                    d.index, d.uuid, d.limit, d.memory.total, d.sm_util_sum
                );
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
