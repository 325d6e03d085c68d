//! One nesting-depth rule for every stored object, applied on every write path (create,
//! update, every patch type, apply) and when loading a data dir.
//!
//! Why 100: the server and its clients (kube-rs, our own reads, the journal) parse JSON
//! with serde_json, which stops at 128 nested levels. A stored object is always sent or
//! kept inside a wrapper (list `items`, watch event `object`, Table `rows[].object`,
//! journal `obj`), at most four levels deeper; an object deeper than that could be stored
//! but never read back. 100 leaves room for every wrapper.

use serde_json::Value;

use crate::status::ApiError;

/// The deepest nesting a stored object may have; the object itself is level 1.
pub const MAX_OBJECT_DEPTH: usize = 100;

/// Nesting depth of `v` (a scalar is 0, `{}` or `[]` is 1), counted without recursion and
/// stopping once `cap` is passed, so hostile input costs no more than the cap.
pub fn depth_capped(v: &Value, cap: usize) -> usize {
    let mut deepest = 0;
    let mut stack: Vec<(&Value, usize)> = vec![(v, 1)];
    while let Some((v, d)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Object(m) => Box::new(m.values()),
            Value::Array(a) => Box::new(a.iter()),
            _ => continue,
        };
        deepest = deepest.max(d);
        if deepest > cap {
            return deepest;
        }
        stack.extend(children.map(|c| (c, d + 1)));
    }
    deepest
}

/// 422 Invalid unless `obj` nests at most [`MAX_OBJECT_DEPTH`] levels.
pub fn check(group: &str, kind: &str, name: &str, obj: &Value) -> Result<(), ApiError> {
    let d = depth_capped(obj, MAX_OBJECT_DEPTH);
    if d <= MAX_OBJECT_DEPTH {
        return Ok(());
    }
    Err(ApiError::invalid(
        group,
        kind,
        name,
        &[(
            "<object>",
            format!(
                "Invalid value: the object nests deeper than {MAX_OBJECT_DEPTH} levels; flatten it (lists and maps inside maps count one level each)"
            ),
        )],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn nested(levels: usize) -> Value {
        let mut v = json!("leaf");
        for i in 0..levels {
            v = if i % 2 == 0 {
                json!({"a": v})
            } else {
                json!([v])
            };
        }
        v
    }

    #[test]
    fn scalars_and_containers() {
        assert_eq!(depth_capped(&json!(1), 10), 0);
        assert_eq!(depth_capped(&json!({}), 10), 1);
        assert_eq!(depth_capped(&json!({"a": [1, {"b": {}}]}), 10), 4);
    }

    #[test]
    fn the_limit_is_readable_inside_every_wrapper() {
        let deepest = nested(MAX_OBJECT_DEPTH);
        assert!(check("", "ConfigMap", "c", &deepest).is_ok());
        // A list of Table rows around it (the deepest wrapper) still parses with serde_json.
        let wrapped = json!({"kind": "Table", "rows": [{"object": {"items": [deepest]}}]});
        let text = serde_json::to_string(&wrapped).unwrap();
        assert!(serde_json::from_str::<Value>(&text).is_ok());
        let e = check("", "ConfigMap", "c", &nested(MAX_OBJECT_DEPTH + 1)).unwrap_err();
        assert_eq!(e.code, 422);
        assert!(e.message.contains("deeper than 100"), "{}", e.message);
    }

    proptest! {
        #[test]
        fn depth_matches_a_recursive_count(levels in 0usize..150, cap in 1usize..200) {
            let d = depth_capped(&nested(levels), cap);
            if levels <= cap { prop_assert_eq!(d, levels); } else { prop_assert!(d > cap); }
        }
    }
}
