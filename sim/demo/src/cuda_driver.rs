//! The simulated NVIDIA node's kernel side of the stand-in CUDA driver
//! (`FAKE_CUDA_DRIVER_SOCKET`, see `sim/cuda-stand-in/README.md`): it answers each
//! connection with the caller's pid from `SO_PEERCRED`, which the kernel gives in the
//! host's PID namespace, so a pod's process is recorded (and reported by the stand-in
//! NVML) under its host pid, as with the real driver.

use std::path::Path;

use tokio::io::AsyncWriteExt;
use tokio::net::UnixListener;
use tokio::task::JoinHandle;

/// The driver of one node: serves its socket.
pub struct CudaDriver {
    task: JoinHandle<()>,
}

impl CudaDriver {
    /// Serves `socket`.
    pub fn start(socket: &Path) -> std::io::Result<CudaDriver> {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket)?;
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    if let Some(pid) = stream.peer_cred().ok().and_then(|c| c.pid()) {
                        let _ = stream.write_all(pid.to_string().as_bytes()).await;
                    }
                });
            }
        });
        Ok(CudaDriver { task })
    }

    /// Stops serving.
    pub fn stop(&self) {
        self.task.abort();
    }
}
