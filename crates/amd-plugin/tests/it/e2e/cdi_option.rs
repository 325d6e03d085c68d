//! The `--cdi` option end to end: Allocate answers with CDI names, the spec is kept.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdi_option_answers_with_cdi_names_and_keeps_the_spec() {
    let tree = hami_sysfs_fixtures::mi210_xgmi().unwrap();
    let dir = tree.sysfs_root().parent().unwrap().join("cdi");
    let h = Harness::start_with(
        tree,
        Opts {
            cdi: Some(dir.clone()),
            ..Default::default()
        },
    )
    .await;
    let d = h.devices[2].clone();
    h.schedule(
        "cdi",
        json!([gpu_container("main", 1)]),
        json!([]),
        &[vec![dev(&d, 1024, 26)]],
        true,
    );
    let pod = h.wait_phase("cdi").await;
    assert_eq!(pod["status"]["phase"], "Running", "{pod}");
    let record: Value = serde_json::from_str(ann(&pod, RECORD_ANNOTATION).unwrap()).unwrap();
    let main = &record["main"][0];
    assert_eq!(
        main["cdiDevices"],
        json!([format!("amd.com/gpu=card{}", d.card)])
    );
    assert_eq!(main["devices"], json!([]), "devices come from the CDI spec");
    assert_eq!(main["envs"]["HSA_CU_MASK"], "0:0-25");
    let spec: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(hami_amd_plugin::cdi::SPEC_FILE)).unwrap(),
    )
    .unwrap();
    hami_amd_plugin::cdi::validate(&spec).unwrap();
    let entry = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == format!("card{}", d.card))
        .unwrap();
    assert_eq!(
        entry["containerEdits"]["deviceNodes"][1]["path"],
        format!("/dev/dri/renderD{}", d.render)
    );
}
