//! D-5 run mapping (pure): kubelet calls Allocate once per container, in pod order (init
//! containers first), without naming the container. The scheduler's device list has one
//! run per container in that order, so each call consumes the first run that still holds
//! devices; its device count must equal kubelet's request. Empty runs (padding of
//! containers without GPUs) are kept so indices keep naming containers.

use crate::device_list::{
    ContainerDevices, DeviceListError, decode_pod_devices, encode_pod_devices, first_non_empty_run,
};

/// The run one Allocate consumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextRun {
    /// Index of the run = index of the container in device-list order (init first).
    pub run_index: usize,
    /// The devices of that run, in the scheduler's (allocation) order.
    pub run: ContainerDevices,
    /// The new devices-to-allocate value: this run emptied, padding kept.
    pub remaining: String,
    /// True when no run is left: the pod is fully allocated (`bind-phase=success`).
    pub last: bool,
}

/// Why no run could be taken; each names what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// The pod has no device list: the scheduler did not place it.
    #[error("pod has no {key} annotation: it was not scheduled by HAMi")]
    NoDecision {
        /// The annotation that should hold the list.
        key: &'static str,
    },
    /// The device list cannot be decoded.
    #[error("{key} is malformed: {source}")]
    DeviceList {
        /// The annotation that holds the list.
        key: &'static str,
        /// What is wrong with it.
        #[source]
        source: DeviceListError,
    },
    #[error(
        "no container of the pod is left to allocate, but kubelet asked for {requested} device(s)"
    )]
    /// Every run is used up, yet kubelet asks for more.
    NothingLeft {
        /// Devices kubelet asked for.
        requested: usize,
    },
    #[error(
        "container run {run} of the pod holds {in_run} device(s) but kubelet asked for {requested}: the request does not match the scheduler's decision"
    )]
    /// The next run does not match kubelet's request.
    CountMismatch {
        /// Index of the run (= container in device-list order).
        run: usize,
        /// Devices in that run.
        in_run: usize,
        /// Devices kubelet asked for.
        requested: usize,
    },
}

/// Takes the next run of the list in `text` (annotation `key`, named in errors).
pub fn take_next_run(
    key: &'static str,
    text: Option<&str>,
    requested: usize,
) -> Result<NextRun, RunError> {
    let text = text.ok_or(RunError::NoDecision { key })?;
    let mut runs =
        decode_pod_devices(text).map_err(|source| RunError::DeviceList { key, source })?;
    let run_index = first_non_empty_run(&runs).ok_or(RunError::NothingLeft { requested })?;
    let run = std::mem::take(&mut runs[run_index]);
    if run.len() != requested {
        return Err(RunError::CountMismatch {
            run: run_index,
            in_run: run.len(),
            requested,
        });
    }
    let remaining =
        encode_pod_devices(&runs).map_err(|source| RunError::DeviceList { key, source })?;
    Ok(NextRun {
        run_index,
        run,
        remaining,
        last: first_non_empty_run(&runs).is_none(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device_list::ContainerDevice;
    use proptest::prelude::*;

    const KEY: &str = "hami.io/vgpu-devices-to-allocate";

    fn dev(uuid: &str) -> ContainerDevice {
        ContainerDevice {
            uuid: uuid.into(),
            device_type: "NVIDIA".into(),
            mem_mib: 100,
            cores: 30,
        }
    }

    #[test]
    fn init_first_padding_kept_and_count_checked() {
        let text = ";GPU-a,NVIDIA,100,30:;GPU-b,NVIDIA,100,30:GPU-a,NVIDIA,100,30:;;";
        let first = take_next_run(KEY, Some(text), 1).unwrap();
        assert_eq!(first.run_index, 1);
        assert_eq!(first.run, vec![dev("GPU-a")]);
        assert!(!first.last);
        assert_eq!(
            first.remaining,
            ";;GPU-b,NVIDIA,100,30:GPU-a,NVIDIA,100,30:;;"
        );
        let err = take_next_run(KEY, Some(&first.remaining), 1).unwrap_err();
        assert!(
            err.to_string()
                .contains("holds 2 device(s) but kubelet asked for 1")
        );
        let second = take_next_run(KEY, Some(&first.remaining), 2).unwrap();
        assert_eq!(second.run_index, 2);
        assert!(second.last);
        assert_eq!(second.remaining, ";;;;");
        assert_eq!(
            take_next_run(KEY, Some(&second.remaining), 1),
            Err(RunError::NothingLeft { requested: 1 })
        );
        assert!(
            take_next_run(KEY, None, 1)
                .unwrap_err()
                .to_string()
                .contains(KEY)
        );
        assert!(
            take_next_run(KEY, Some("x,y:;"), 1)
                .unwrap_err()
                .to_string()
                .contains("malformed")
        );
    }

    proptest! {
        /// Consuming runs one by one visits exactly the non-empty runs, in order, and
        /// the list keeps its length (padding) throughout.
        #[test]
        fn runs_are_consumed_in_order(sizes in proptest::collection::vec(0usize..3, 1..6)) {
            let runs: Vec<ContainerDevices> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| (0..n).map(|k| dev(&format!("GPU-{i}-{k}"))).collect())
                .collect();
            let mut text = encode_pod_devices(&runs).unwrap();
            let expected: Vec<usize> = sizes.iter().enumerate().filter(|(_, n)| **n > 0).map(|(i, _)| i).collect();
            for (step, &i) in expected.iter().enumerate() {
                let next = take_next_run(KEY, Some(&text), sizes[i]).unwrap();
                prop_assert_eq!(next.run_index, i);
                prop_assert_eq!(&next.run, &runs[i]);
                prop_assert_eq!(next.last, step + 1 == expected.len());
                prop_assert_eq!(decode_pod_devices(&next.remaining).unwrap().len(), runs.len());
                text = next.remaining;
            }
            let is_nothing_left = matches!(take_next_run(KEY, Some(&text), 1), Err(RunError::NothingLeft { .. }));
            prop_assert!(is_nothing_left);
        }
    }
}
