//! Device health: a GPU is healthy when its DRM render node opens (and, when AMD's
//! device-metrics exporter runs, the exporter does not call it unhealthy).

use std::path::Path;

/// Whether `<dev_root>/dri/renderD<render>` can be opened for reading.
pub fn render_node_opens(dev_root: &Path, render: u32) -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .open(dev_root.join(format!("dri/renderD{render}")))
        .is_ok()
}
