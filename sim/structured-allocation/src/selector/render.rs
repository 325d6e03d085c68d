//! Terms back to CEL text (what the webhook and the DeviceClass write; parsing the result
//! gives the same terms).

use hami_dra_core::api::DeviceAttribute;

use super::Term;
use super::lex::quote;

fn render_literal(value: &DeviceAttribute) -> String {
    match value {
        DeviceAttribute {
            string: Some(s), ..
        } => quote(s),
        DeviceAttribute { int: Some(i), .. } => i.to_string(),
        DeviceAttribute { bool: Some(b), .. } => b.to_string(),
        DeviceAttribute {
            version: Some(v), ..
        } => quote(v),
        _ => "null".into(),
    }
}

fn render_term(t: &Term) -> String {
    let split = |name: &str| {
        let (domain, short) = name.rsplit_once('/').unwrap_or(("", name));
        (domain.to_string(), short.to_string())
    };
    match t {
        Term::Driver(d) => format!("device.driver == {}", quote(d)),
        Term::Attribute { name, value } => {
            let (domain, short) = split(name);
            format!(
                "device.attributes[{}].{short} == {}",
                quote(&domain),
                render_literal(value)
            )
        }
        Term::AttributeIn { name, values } => {
            let (domain, short) = split(name);
            let list: Vec<String> = values.iter().map(render_literal).collect();
            format!(
                "device.attributes[{}].{short} in [{}]",
                quote(&domain),
                list.join(", ")
            )
        }
        Term::Capacity {
            name,
            cmp,
            quantity,
            ..
        } => {
            let (domain, short) = split(name);
            format!(
                "device.capacity[{}].{short}.compareTo(quantity({})) {} 0",
                quote(&domain),
                quote(quantity),
                cmp.text()
            )
        }
        Term::Not(t) => format!("!({})", render_term(t)),
    }
}

/// The CEL text of terms joined by `&&` (what the webhook and the DeviceClass write).
pub fn render(terms: &[Term]) -> String {
    let parts: Vec<String> = terms.iter().map(render_term).collect();
    parts.join(" && ")
}
