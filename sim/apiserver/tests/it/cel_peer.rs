//! The matchConditions evaluator (`src/cel`) against a real CEL implementation (PyPI
//! cel-python): random boolean expressions built from the forms webhook authors write
//! (`has()`, field and map access that may be missing, `in` on maps and lists, string
//! functions, `exists`/`all`/`exists_one` over containers, the shipped webhook's nested
//! `exists` over resources and its `has(..) && a in m ? m[a] : ''` lookup, `size`,
//! comparisons, `?:`, `!`, `&&`, `||`) over random pods and requests (CREATE with
//! `oldObject` null, UPDATE, other users). Both sides must agree on true / false / error.
//!
//! Comparisons are generated between values of one type: cel-python follows CEL's older
//! spec there (a cross-type `==` is an error), cel-go and so Kubernetes the current one
//! (false, which `src/cel/value.rs` does and unit-tests).

use hami_apiserver::cel::{self, Activation, Val};
use hami_apiserver::match_conditions;
use serde_json::{Value, json};

struct Rng(u64);

impl Rng {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.next(xs.len())]
    }
}

const RESOURCES: &[&str] = &["amd.com/gpu", "nvidia.com/gpu", "cpu", "example.com/fpga"];
const KEYS: &[&str] = &["hami.io/vgpu-node", "team", "app", "hami.io/webhook"];
const WORDS: &[&str] = &["p", "c0", "c1", "gpu", "a", "", "team-a", "system:admin"];

fn pod(rng: &mut Rng) -> Value {
    let map = |rng: &mut Rng| -> Option<Value> {
        (rng.next(3) != 0).then(|| {
            let m: serde_json::Map<String, Value> = (0..rng.next(3))
                .map(|_| (rng.pick(KEYS).to_string(), json!(rng.pick(WORDS))))
                .collect();
            Value::Object(m)
        })
    };
    let container = |rng: &mut Rng, i: usize| {
        let mut c = json!({"name": format!("c{i}"), "image": "busybox"});
        if rng.next(3) != 0 {
            let mut res = json!({});
            for section in ["limits", "requests"] {
                if rng.next(2) == 0 {
                    let m: serde_json::Map<String, Value> = (0..rng.next(3))
                        .map(|_| (rng.pick(RESOURCES).to_string(), json!("1")))
                        .collect();
                    res[section] = Value::Object(m);
                }
            }
            c["resources"] = res;
        }
        c
    };
    let mut p = json!({"metadata": {"name": rng.pick(&["p", "gpu-pod", "web"])}, "spec": {}});
    if let Some(l) = map(rng) {
        p["metadata"]["labels"] = l;
    }
    if let Some(a) = map(rng) {
        p["metadata"]["annotations"] = a;
    }
    let n = rng.next(3) + usize::from(rng.next(4) != 0);
    p["spec"]["containers"] = (0..n).map(|i| container(rng, i)).collect();
    if rng.next(3) == 0 {
        p["spec"]["initContainers"] = (0..rng.next(2) + 1).map(|i| container(rng, i)).collect();
    }
    if rng.next(2) == 0 {
        p["spec"]["priority"] = json!(rng.next(6) as i64 - 1);
    }
    p
}

fn lit(rng: &mut Rng, xs: &[&str]) -> String {
    format!("'{}'", rng.pick(xs))
}

fn list(rng: &mut Rng, xs: &[&str]) -> String {
    let items: Vec<String> = (0..rng.next(3) + 1).map(|_| lit(rng, xs)).collect();
    format!("[{}]", items.join(", "))
}

fn map_expr(rng: &mut Rng) -> &'static str {
    ["object.metadata.labels", "object.metadata.annotations"][rng.next(2)]
}

fn container_pred(rng: &mut Rng, c: &str) -> String {
    match rng.next(6) {
        0 => format!("{c}.name.startsWith({})", lit(rng, WORDS)),
        1 => format!("has({c}.resources)"),
        2 => format!(
            "(has({c}.resources) && has({c}.resources.limits) && {} in {c}.resources.limits)",
            lit(rng, RESOURCES)
        ),
        // May be an error: resources or limits absent.
        3 => format!("{} in {c}.resources.limits", lit(rng, RESOURCES)),
        4 => format!("{c}.name == {}", lit(rng, WORDS)),
        _ => format!("size({c}.name) > {}", rng.next(3)),
    }
}

fn atom(rng: &mut Rng) -> String {
    match rng.next(17) {
        0 => format!("has({})", map_expr(rng)),
        1 => format!("{} in {}", lit(rng, KEYS), map_expr(rng)),
        2 => format!(
            "{}[{}] == {}",
            map_expr(rng),
            lit(rng, KEYS),
            lit(rng, WORDS)
        ),
        3 => format!(
            "object.metadata.name.{}({})",
            ["startsWith", "endsWith", "contains"][rng.next(3)],
            lit(rng, WORDS)
        ),
        4 => format!("request.operation {} 'CREATE'", ["==", "!="][rng.next(2)]),
        5 => format!("request.userInfo.username in {}", list(rng, WORDS)),
        6 => {
            let m = ["exists", "all", "exists_one"][rng.next(3)];
            let p = container_pred(rng, "c");
            format!("object.spec.containers.{m}(c, {p})")
        }
        7 => {
            let p = container_pred(rng, "c");
            format!(
                "(has(object.spec.initContainers) && object.spec.initContainers.exists(c, {p}))"
            )
        }
        // The shipped webhook's shape: resources exists over containers exists.
        8 => {
            let p = container_pred(rng, "c").replace(&lit(rng, RESOURCES), "r");
            format!(
                "{}.exists(r, object.spec.containers.exists(c, (has(c.resources) && has(c.resources.limits) && r in c.resources.limits) || {p}))",
                list(rng, RESOURCES)
            )
        }
        9 => format!(
            "size(object.spec.containers) {} {}",
            ["==", "<", ">=", "!="][rng.next(4)],
            rng.next(4)
        ),
        10 => format!("object.spec.containers[{}].name == 'c0'", rng.next(3)),
        11 => format!(
            "object.spec.priority {} {}",
            ["<", "<=", ">", ">=", "=="][rng.next(5)],
            rng.next(5) as i64 - 1
        ),
        12 => "request.dryRun".into(),
        13 => "oldObject == null".into(),
        // The shipped guard's lookup: a missing annotation reads as ''.
        14 => {
            let k = lit(rng, KEYS);
            let var = ["object", "oldObject"][rng.next(2)];
            format!(
                "(request.operation == 'UPDATE' && (has({var}.metadata.annotations) && {k} in {var}.metadata.annotations ? {var}.metadata.annotations[{k}] : '') != {})",
                lit(rng, WORDS)
            )
        }
        15 => format!(
            "{}.exists(a, has(object.metadata.annotations) && a in object.metadata.annotations)",
            list(rng, KEYS)
        ),
        _ => ["true", "false"][rng.next(2)].into(),
    }
}

fn expr(rng: &mut Rng, depth: usize) -> String {
    if depth == 0 || rng.next(3) == 0 {
        return atom(rng);
    }
    match rng.next(5) {
        0 => format!("!({})", expr(rng, depth - 1)),
        1 => format!(
            "({} ? {} : {})",
            expr(rng, depth - 1),
            expr(rng, depth - 1),
            expr(rng, depth - 1)
        ),
        2 => format!("({} || {})", expr(rng, depth - 1), expr(rng, depth - 1)),
        _ => format!("({} && {})", expr(rng, depth - 1), expr(rng, depth - 1)),
    }
}

fn request(rng: &mut Rng, object: &Value, old: &Value) -> Value {
    let op = if old.is_null() { "CREATE" } else { "UPDATE" };
    json!({
        "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": object["metadata"]["name"], "namespace": "default", "operation": op,
        "userInfo": {"username": rng.pick(&["system:admin", "team-a", "system:serviceaccount:hami-system:hami-scheduler"]), "groups": ["system:authenticated"]},
        "object": object, "oldObject": old, "dryRun": rng.next(4) == 0,
    })
}

fn peer(cases: &[Value]) -> Vec<Value> {
    hami_cel_peer::run(
        &hami_cel_peer::script(env!("CARGO_MANIFEST_DIR"), "tests/peers/cel_peer.py"),
        &json!({ "cases": cases }),
    )
}

fn ours(expression: &str, review_request: &Value) -> Value {
    let program = cel::compile(expression, &match_conditions::decls())
        .unwrap_or_else(|e| panic!("{expression}: {}", e.positioned(expression)));
    let vars = match_conditions::bindings(review_request);
    match program.eval(&Activation { vars: &vars }) {
        Ok(Val::Bool(b)) => json!(b),
        Ok(other) => json!(format!("value: {other:?}")),
        Err(e) => json!(format!("error: {e}")),
    }
}

#[test]
fn agrees_with_cel_python() {
    let mut rng = Rng(0xce1);
    let mut cases = Vec::new();
    let mut requests = Vec::new();
    for _ in 0..400 {
        let e = expr(&mut rng, 3);
        let object = pod(&mut rng);
        let old = if rng.next(2) == 0 {
            Value::Null
        } else {
            pod(&mut rng)
        };
        let req = request(&mut rng, &object, &old);
        let mut bare = req.clone();
        for k in ["uid", "object", "oldObject"] {
            bare.as_object_mut().unwrap().remove(k);
        }
        cases.push(json!({"expression": e, "bindings": {"object": object, "oldObject": old, "request": bare}}));
        requests.push(req);
    }
    let theirs = peer(&cases);
    let (mut t, mut f, mut err) = (0, 0, 0);
    for ((case, req), want) in cases.iter().zip(&requests).zip(&theirs) {
        let expression = case["expression"].as_str().unwrap();
        let got = ours(expression, req);
        let kind = |v: &Value| match v {
            Value::Bool(b) => b.to_string(),
            Value::String(s) if s.starts_with("error") => "error".into(),
            other => other.to_string(),
        };
        assert_eq!(
            kind(&got),
            kind(want),
            "{expression}\nours: {got}\ncel-python: {want}\nbindings: {}",
            case["bindings"]
        );
        match kind(want).as_str() {
            "true" => t += 1,
            "false" => f += 1,
            _ => err += 1,
        }
    }
    // The corpus exercises every answer substantially.
    assert!(
        t > 60 && f > 60 && err > 30,
        "true {t}, false {f}, error {err}"
    );
}
