//! The driver's checkpoint file refused with what to do: corrupt, or a FIFO planted in its
//! place (refused without blocking).

use crate::kubelet_support::*;

#[test]
fn a_corrupt_checkpoint_is_refused_with_what_to_do() {
    let n = node();
    let cfg = config(&n);
    std::fs::create_dir_all(cfg.checkpoint.parent().unwrap()).unwrap();
    std::fs::write(&cfg.checkpoint, b"{\"version\": 1, \"claims\": ").unwrap();
    let err = Driver::new(cfg, Claims::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("drain the node"), "{err}");

    // A journal damaged before its last line (a torn last line is an unacknowledged
    // append, dropped): refused too, naming the journal and the line.
    let n = node();
    let cfg = config(&n);
    std::fs::create_dir_all(cfg.checkpoint.parent().unwrap()).unwrap();
    let journal = hami_amdgpu_dra_plugin::checkpoint_store::journal_path(&cfg.checkpoint);
    std::fs::write(
        &journal,
        b"{\"remove\":{\"uid\":\"a\"}}\ngarbage\n{\"remove\":{\"uid\":\"b\"}}\n",
    )
    .unwrap();
    let err = Driver::new(cfg, Claims::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("checkpoint.json.journal")
            && err.contains("line 2")
            && err.contains("drain the node"),
        "{err}"
    );
}

/// Issue 27 item 6: a FIFO at the checkpoint's path (or the journal's) is refused at start
/// with what to remove, without waiting for a writer that never comes.
#[test]
fn a_fifo_at_the_checkpoint_is_refused_without_blocking() {
    for journal in [false, true] {
        let n = node();
        let cfg = config(&n);
        std::fs::create_dir_all(cfg.checkpoint.parent().unwrap()).unwrap();
        let path = if journal {
            hami_amdgpu_dra_plugin::checkpoint_store::journal_path(&cfg.checkpoint)
        } else {
            cfg.checkpoint.clone()
        };
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(made.success());
        let (tx, rx) = std::sync::mpsc::channel();
        // A thread: on the landed code the open blocks forever (the test then fails on
        // the timeout below; the stuck thread ends with the test process).
        std::thread::spawn(move || {
            let _ = tx.send(
                Driver::new(cfg, Claims::default())
                    .err()
                    .map(|e| e.to_string()),
            );
        });
        let err = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the start did not block on the FIFO")
            .expect("refused");
        assert!(
            err.contains(&path.display().to_string())
                && err.contains("a FIFO, not a regular file")
                && err.contains("remove it"),
            "{err}"
        );
    }
}
