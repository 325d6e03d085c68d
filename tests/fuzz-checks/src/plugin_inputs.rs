//! Checks of what the device plugins accept: kubelet's gRPC messages, the scheduler's
//! device list as Allocate consumes it, and the per-container hook configuration the hooks
//! read back.

use hami_deviceplugin_api::v1beta1::{
    AllocateRequest, PreStartContainerRequest, PreferredAllocationRequest,
};
use hami_protocol::device_list::decode_pod_devices;
use hami_protocol::hook_config::{self, HookConfig};
use hami_protocol::identity::KubeletDeviceId;
use hami_protocol::run_mapping::take_next_run;
use prost::Message;

/// Hook configuration files: what decodes is valid, re-encodes, and decodes the same.
pub fn hook_config(data: &[u8]) {
    let Ok(config) = hook_config::decode(data) else {
        return;
    };
    assert_eq!(
        config.validate(),
        Ok(()),
        "a decoded configuration is valid"
    );
    let text = config
        .encode()
        .expect("a decoded configuration must encode");
    let again: HookConfig = hook_config::decode(text.as_bytes()).expect("encoded must decode");
    assert_eq!(again, config, "hook configuration round trip changed it");
}

/// kubelet's Allocate, GetPreferredAllocation and PreStartContainer bodies: protobuf
/// decoding is total, re-encoding is stable, and every device id either parses as a
/// kubelet id that round-trips or is refused.
pub fn kubelet_messages(data: &[u8]) {
    if let Ok(request) = AllocateRequest::decode(data) {
        let again = AllocateRequest::decode(request.encode_to_vec().as_slice())
            .expect("re-encoded AllocateRequest decodes");
        assert_eq!(again, request);
        for id in request
            .container_requests
            .iter()
            .flat_map(|c| &c.devices_ids)
        {
            device_id(id);
        }
    }
    if let Ok(request) = PreferredAllocationRequest::decode(data) {
        for container in &request.container_requests {
            for id in container
                .available_device_i_ds
                .iter()
                .chain(&container.must_include_device_i_ds)
            {
                device_id(id);
            }
        }
    }
    if let Ok(request) = PreStartContainerRequest::decode(data) {
        for id in &request.devices_ids {
            device_id(id);
        }
    }
}

fn device_id(id: &str) {
    if let Ok(parsed) = KubeletDeviceId::parse(id) {
        assert_eq!(
            KubeletDeviceId::parse(&parsed.to_string()).as_ref(),
            Ok(&parsed)
        );
    }
}

/// Allocate's D-5 run mapping over any device-list text: the run taken has exactly the
/// requested devices, it is the first non-empty run, and what is left no longer holds it.
pub fn run_mapping(data: &[u8]) {
    let Some((&requested, rest)) = data.split_first() else {
        return;
    };
    let requested = usize::from(requested % 9);
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let Ok(next) = take_next_run("hami.io/amd-devices-to-allocate", Some(text), requested) else {
        return;
    };
    assert_eq!(next.run.len(), requested);
    let before = decode_pod_devices(text).expect("a list Allocate used decodes");
    assert!(before[..next.run_index].iter().all(|run| run.is_empty()));
    assert_eq!(before[next.run_index], next.run);
    let after = decode_pod_devices(&next.remaining).expect("what is left decodes");
    assert_eq!(after.len(), before.len(), "runs keep their indices (D-1)");
    assert!(after[next.run_index].is_empty());
    assert_eq!(next.last, after.iter().all(|run| run.is_empty()));
}
