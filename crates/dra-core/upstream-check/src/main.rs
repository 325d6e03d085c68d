//! Round-trips resource.k8s.io/v1 JSON (an object or an array of objects) through
//! k8s-openapi's upstream-generated types: the first file as ResourceClaims, the rest as
//! ResourceSlices. Exits non-zero on the first difference.

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::Value;

fn check<T: serde::de::DeserializeOwned + serde::Serialize>(path: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    let items = match v {
        Value::Array(a) => a,
        o => vec![o],
    };
    for item in items {
        let typed: T = serde_json::from_value(item.clone()).map_err(|e| format!("{path}: {e}"))?;
        let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
        if back != item {
            return Err(format!(
                "{path}: differs after k8s-openapi v1_36:\n ours: {item}\n upstream: {back}"
            ));
        }
    }
    println!("{path}: identical through k8s-openapi v1_36");
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((claim, slices)) = args.split_first() else {
        eprintln!("usage: dra-upstream-check <claims.json> [slices.json...]");
        return std::process::ExitCode::from(2);
    };
    let result = check::<ResourceClaim>(claim)
        .and_then(|()| slices.iter().try_for_each(|p| check::<ResourceSlice>(p)));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            std::process::ExitCode::from(1)
        }
    }
}
