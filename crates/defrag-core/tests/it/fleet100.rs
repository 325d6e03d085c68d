//! A synthetic fragmented fleet of 100 nodes (seeded, the same on every run): nodes of 8
//! MI210, 8 MI300X or 8 A100, every card filled to 5/8 to 7/8 with slices of 1/8 to 3/8
//! placed by the scheduler's fit: no card is idle and no half-card pod fits as it stands,
//! though the fleet holds room for hundreds of them.

use hami_defrag_core::{Policy, Target, measure};
use hami_protocol::names::Vendor;

use crate::fixtures::{A100, Fleet, MI210, MI300X, Model, movable, slice};
use crate::scenarios::check;

const NODES: usize = 100;
const CARDS: usize = 8;

fn fragmented() -> Fleet {
    // A fixed LCG: the same fleet on every run and machine.
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |below: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % below
    };
    let mut f = Fleet::new();
    let mut pods = 0;
    for n in 0..NODES {
        let model: Model = [MI210, MI300X, A100][n % 3];
        let name = format!("n{n:03}");
        f.node(&name, &[model; CARDS]);
        for c in 0..CARDS {
            let mut used = 0;
            while used < 5 {
                let eighths = (1 + next(3)).min(8 - used);
                used += eighths;
                let req = slice(
                    model.vendor,
                    model.devmem * eighths / 8,
                    u32::try_from(eighths * 100 / 8).unwrap(),
                );
                let card = format!("{name}-{c}");
                pods += 1;
                assert!(f.place(&format!("p{pods}"), &name, &card, req, movable()));
            }
        }
    }
    f
}

#[test]
fn plans_over_a_fragmented_100_node_fleet_apply_improve_and_are_fixed_points() {
    let f = fragmented();
    let fleet = measure(&f.cluster.nodes);
    assert_eq!(fleet.amd.cards + fleet.nvidia.cards, NODES * CARDS);
    assert_eq!(fleet.amd.idle_cards + fleet.nvidia.idle_cards, 0);
    let policy = Policy {
        max_moves: 256,
        ..Policy::default()
    };
    let half = |vendor: Vendor, model: Model| Target::FitPod {
        pod: "ns/half".into(),
        request: Box::new(slice(vendor, model.devmem / 2, 50)),
    };
    let whole = Target::FitPod {
        pod: "ns/whole".into(),
        request: Box::new(slice(Vendor::Amd, MI300X.devmem, 100)),
    };
    let targets = [
        half(Vendor::Amd, MI210),
        half(Vendor::Nvidia, A100),
        whole,
        Target::FreeWholeCards {
            device_type: "MI300X".into(),
            count: 4,
        },
        Target::FreeWholeCards {
            device_type: "A100".into(),
            count: 2,
        },
        Target::MinFreeOrFull { percent: 50 },
    ];
    for target in &targets {
        let p = check(&f.cluster, target, &policy, "fleet100");
        assert!(
            p.shortfall_before > 0 && !p.moves.is_empty(),
            "{}",
            target.describe()
        );
        // Slices of at most 3/8 and a quarter of each card free on average: the pod and
        // card targets are reachable by moving pods alone.
        if !matches!(target, Target::MinFreeOrFull { .. }) {
            assert!(p.reached, "{}", target.describe());
        }
    }
}
