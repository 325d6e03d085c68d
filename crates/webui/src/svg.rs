//! Server-rendered SVG: allocation meters and the CU map (line charts: [`crate::charts`]).
//! Each carries its data as attributes (`data-owner`, `data-pattern`) so tests and
//! assistive tools can read what is drawn; each has a `<title>` for screen readers.

use std::fmt::Write;

use hami_protocol::cu_list::CuSet;

use crate::html::esc;

/// Colours of series and CU owners: Okabe and Ito's palette, told apart with the common
/// colour-vision deficiencies; the darker first (chart lines on a light page).
pub const PALETTE: [&str; 8] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000",
];
/// For each colour of [`PALETTE`], the ink of the pattern drawn over it (black or white,
/// whichever contrasts more).
const INK: [&str; 8] = [
    "#fff", "#000", "#000", "#000", "#000", "#000", "#000", "#fff",
];
/// The CU map's patterns, so two owners of a card differ without their colours too: name
/// (said in the legend) and marks in a 4-unit tile (`{ink}` the ink).
const PATTERNS: [(&str, &str); 7] = [
    ("plain", ""),
    (
        "striped",
        "<path d=\"M-1,1 l2,-2 M0,4 l4,-4 M3,5 l2,-2\" stroke=\"{ink}\" stroke-width=\"1\"/>",
    ),
    (
        "dotted",
        "<circle cx=\"2\" cy=\"2\" r=\"0.9\" fill=\"{ink}\"/>",
    ),
    (
        "vertical bars",
        "<rect x=\"1.5\" width=\"1\" height=\"4\" fill=\"{ink}\"/>",
    ),
    (
        "horizontal bars",
        "<rect y=\"1.5\" width=\"4\" height=\"1\" fill=\"{ink}\"/>",
    ),
    (
        "checked",
        "<rect width=\"2\" height=\"2\" fill=\"{ink}\"/><rect x=\"2\" y=\"2\" width=\"2\" height=\"2\" fill=\"{ink}\"/>",
    ),
    (
        "back-striped",
        "<path d=\"M-1,3 l2,2 M0,0 l4,4 M3,-1 l2,2\" stroke=\"{ink}\" stroke-width=\"1\"/>",
    ),
];
/// Colour of free CUs.
pub const FREE: &str = "#e3e7ec";

/// A legend's colour swatch: a one-rect SVG, so the colour is a presentation attribute and
/// the page needs no inline style (the UI's Content-Security-Policy allows none).
pub fn swatch(colour: &str) -> String {
    format!(
        "<svg class=\"swatch\" viewBox=\"0 0 1 1\" aria-hidden=\"true\" focusable=\"false\"><rect width=\"1\" height=\"1\" fill=\"{}\"/></svg>",
        esc(colour)
    )
}

fn fmt_value(v: f64) -> String {
    if v >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A horizontal meter: granted (solid) and used (hatched overlay) out of a total.
pub fn meter(label: &str, granted: f64, used: Option<f64>, total: f64, unit: &str) -> String {
    let (w, h) = (220.0, 14.0);
    let frac = |v: f64| {
        if total > 0.0 {
            (v / total).clamp(0.0, 1.0)
        } else {
            0.0
        }
    };
    let used_text = used
        .map(|u| format!(", {} used", fmt_value(u)))
        .unwrap_or_default();
    let text = format!(
        "{label}: {} of {} {unit} granted{used_text}",
        fmt_value(granted),
        fmt_value(total)
    );
    let mut out = format!(
        "<svg class=\"meter\" viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"{t}\"><title>{t}</title><rect width=\"{w}\" height=\"{h}\" fill=\"{FREE}\"/><rect width=\"{:.1}\" height=\"{h}\" fill=\"{}\"/>",
        frac(granted) * w,
        PALETTE[0],
        t = esc(&text)
    );
    if let Some(u) = used {
        let _ = write!(
            out,
            "<rect y=\"4\" width=\"{:.1}\" height=\"6\" fill=\"{}\"/>",
            frac(u) * w,
            PALETTE[4]
        );
    }
    let _ = write!(out, "</svg> <span class=\"muted\">{}</span>", esc(&text));
    out
}

/// How one owner of CUs is drawn: a colour of [`PALETTE`] and a pattern of [`PATTERNS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    /// Index in [`PALETTE`].
    pub colour: usize,
    /// Index in [`PATTERNS`].
    pub pattern: usize,
}

impl Style {
    /// Its colour.
    pub fn colour(self) -> &'static str {
        PALETTE[self.colour]
    }

    /// Its pattern's name, as the legend says it.
    pub fn pattern(self) -> &'static str {
        PATTERNS[self.pattern].0
    }
}

/// FNV-1a: stable across runs and builds (std's hasher is seeded).
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The next index from `i` not yet `taken` (all taken: `i`), marked taken.
fn first_free(taken: &mut [bool], i: usize) -> usize {
    let n = taken.len();
    let free = (0..n)
        .map(|k| (i + k) % n)
        .find(|k| !taken[*k])
        .unwrap_or(i);
    taken[free] = true;
    free
}

/// The styles of a card's CU owners, in their order: each pod's own colour and pattern,
/// from a hash of its name (so a pod keeps them on every card and after every refresh, not
/// its place among a card's owners); where two owners of one card hash alike, the later one
/// takes the next colour (and pattern) not taken on that card. Up to [`PATTERNS`]`.len()`
/// owners of one card differ in pattern as well as colour; the legend names each owner with
/// its pattern and CUs, so nothing has to be told apart by colour to read the map.
pub fn owner_styles(pods: &[&str]) -> Vec<Style> {
    let mut colours = [false; PALETTE.len()];
    let mut patterns = [false; PATTERNS.len()];
    pods.iter()
        .map(|pod| {
            let hash = fnv(pod);
            let colour = first_free(&mut colours, (hash % PALETTE.len() as u64) as usize);
            let pattern = first_free(
                &mut patterns,
                (hash / PALETTE.len() as u64 % PATTERNS.len() as u64) as usize,
            );
            Style { colour, pattern }
        })
        .collect()
}

/// The colours of a card's CU owners ([`owner_styles`]).
pub fn owner_colours(pods: &[&str]) -> Vec<&'static str> {
    owner_styles(pods).into_iter().map(Style::colour).collect()
}

/// One owner of CUs on a card.
pub struct CuOwner<'a> {
    /// `namespace/name` of the pod.
    pub pod: &'a str,
    /// Its CUs on the card.
    pub cus: &'a CuSet,
}

/// The CU map of a card: one cell per CU, in the colour and pattern of the pod holding it
/// ([`owner_styles`]); on RDNA (`cu_per_wgp` = 2) the CUs of one WGP sit together in an
/// outlined pair. A CU two pods claim (which the scheduler never writes) is drawn in the
/// first owner's style and listed as a conflict. The patterns' ids are the map's own
/// (from its label), so several maps on a page do not share them.
pub fn cu_map(total: u32, owners: &[CuOwner<'_>], cu_per_wgp: Option<u32>, label: &str) -> String {
    let per_wgp = cu_per_wgp.filter(|n| *n > 1).unwrap_or(1);
    let cell = 9.0;
    let gap = if per_wgp > 1 { 3.0 } else { 1.0 };
    let per_row = 64u32.div_ceil(per_wgp) * per_wgp;
    let rows = total.div_ceil(per_row).max(1);
    let x_of = |cu: u32| {
        let col = cu % per_row;
        col as f64 * cell + (col / per_wgp) as f64 * gap
    };
    let w = x_of(per_row - 1) + cell + 1.0;
    let h = rows as f64 * (cell + 3.0);
    let styles = owner_styles(&owners.iter().map(|o| o.pod).collect::<Vec<_>>());
    let map_id = format!("cu{:08x}", fnv(label) as u32);
    let fills: Vec<String> = (0..owners.len())
        .map(|i| format!("url(#{map_id}-{i})"))
        .collect();
    let mut out = String::with_capacity(total as usize * 100 + 512 + owners.len() * 300);
    let _ = write!(
        out,
        "<svg class=\"cumap\" viewBox=\"0 0 {w:.0} {h:.0}\" width=\"{w:.0}\" height=\"{h:.0}\" role=\"img\" aria-label=\"{t}\" data-cus=\"{total}\" data-cu-per-wgp=\"{per_wgp}\"><title>{t}</title><defs>",
        t = esc(label)
    );
    for (i, style) in styles.iter().enumerate() {
        out.push_str(&pattern_def(&format!("{map_id}-{i}"), *style));
    }
    out.push_str("</defs>");
    // Each owner's marks: one path over its cells, filled with its pattern (the cells
    // below keep their colour; the path lets the pointer through to their titles).
    let mut marks: Vec<String> = vec![String::new(); owners.len()];
    for cu in 0..total {
        let owner = owners.iter().position(|o| o.cus.contains(cu));
        let (fill, who) = match owner {
            Some(i) => (styles[i].colour(), owners[i].pod),
            None => (FREE, ""),
        };
        let y = (cu / per_row) as f64 * (cell + 3.0);
        if let Some(i) = owner.filter(|i| styles[*i].pattern != 0) {
            let _ = write!(
                marks[i],
                "M{:.0},{y:.0}h{}v{cell}h-{}z",
                x_of(cu),
                cell - 1.0,
                cell - 1.0
            );
        }
        let _ = write!(
            out,
            "<rect class=\"cu\" x=\"{:.0}\" y=\"{y:.0}\" width=\"{}\" height=\"{}\" fill=\"{fill}\" data-cu=\"{cu}\" data-owner=\"{}\"><title>CU {cu}: {}</title></rect>",
            x_of(cu),
            cell - 1.0,
            cell,
            esc(who),
            if who.is_empty() {
                "free".to_owned()
            } else {
                esc(who)
            }
        );
    }
    for (i, d) in marks.iter().enumerate().filter(|(_, d)| !d.is_empty()) {
        let _ = write!(
            out,
            "<path class=\"marks\" d=\"{d}\" fill=\"{}\" pointer-events=\"none\" data-pattern=\"{}\"/>",
            fills[i],
            styles[i].pattern()
        );
    }
    if per_wgp > 1 {
        for wgp in 0..total.div_ceil(per_wgp) {
            let first = wgp * per_wgp;
            let y = (first / per_row) as f64 * (cell + 3.0);
            let _ = write!(
                out,
                "<rect class=\"wgp\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"none\" stroke=\"#1b1f24\" stroke-width=\"0.8\" data-wgp=\"{wgp}\"/>",
                x_of(first) - 0.5,
                y - 0.5,
                per_wgp as f64 * cell,
                cell + 1.0
            );
        }
    }
    out.push_str("</svg><ul class=\"legend\">");
    for (i, o) in owners.iter().enumerate() {
        let _ = write!(
            out,
            "<li data-pod=\"{pod}\" data-colour=\"{}\" data-pattern=\"{p}\">{}{pod} ({} CUs: {}; {p})</li>",
            styles[i].colour(),
            owner_swatch(styles[i].colour(), &fills[i]),
            o.cus.len(),
            esc(&o.cus.to_string()),
            pod = esc(o.pod),
            p = styles[i].pattern(),
        );
    }
    let free = (0..total)
        .filter(|cu| !owners.iter().any(|o| o.cus.contains(*cu)))
        .count();
    let _ = write!(out, "<li>{}free ({free} CUs)</li></ul>", swatch(FREE));
    if owners.len() > PATTERNS.len() {
        let _ = write!(
            out,
            "<p class=\"muted\">{} pods share this card: past {} their patterns repeat; each cell names its pod (hover or touch it).</p>",
            owners.len(),
            PATTERNS.len()
        );
    }
    let conflicts: Vec<u32> = (0..total)
        .filter(|cu| owners.iter().filter(|o| o.cus.contains(*cu)).count() > 1)
        .collect();
    if !conflicts.is_empty() {
        let _ = write!(
            out,
            "<p class=\"bad\">{} CUs are claimed by more than one pod (first: CU {}).</p>",
            conflicts.len(),
            conflicts[0]
        );
    }
    out
}

/// An owner's pattern: its marks alone, in the ink that contrasts with its colour, in a
/// 4-unit tile (the cells under it keep the colour).
fn pattern_def(id: &str, style: Style) -> String {
    format!(
        "<pattern id=\"{id}\" patternUnits=\"userSpaceOnUse\" width=\"4\" height=\"4\" data-colour=\"{}\" data-pattern=\"{}\">{}</pattern>",
        style.colour(),
        style.pattern(),
        PATTERNS[style.pattern]
            .1
            .replace("{ink}", INK[style.colour])
    )
}

/// A legend's swatch of an owner: its colour under its pattern (`url(#…)`).
fn owner_swatch(colour: &str, fill: &str) -> String {
    format!(
        "<svg class=\"swatch\" viewBox=\"0 0 8 8\" aria-hidden=\"true\" focusable=\"false\"><rect width=\"8\" height=\"8\" fill=\"{colour}\"/><rect width=\"8\" height=\"8\" fill=\"{fill}\"/></svg>"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(haystack: &str, needle: &str) -> usize {
        haystack.matches(needle).count()
    }

    #[test]
    fn cu_map_cells_match_owners() {
        let a = CuSet::parse("0-9", 38).unwrap();
        let b = CuSet::parse("10,12,37", 38).unwrap();
        let svg = cu_map(
            38,
            &[
                CuOwner {
                    pod: "ns/a",
                    cus: &a,
                },
                CuOwner {
                    pod: "ns/<b>",
                    cus: &b,
                },
            ],
            None,
            "card",
        );
        assert_eq!(count(&svg, "class=\"cu\""), 38);
        assert_eq!(count(&svg, "data-owner=\"ns/a\""), 10);
        assert_eq!(count(&svg, "data-owner=\"ns/&lt;b&gt;\""), 3);
        assert_eq!(count(&svg, "data-owner=\"\""), 25);
        assert_eq!(count(&svg, "class=\"wgp\""), 0);
        assert!(svg.contains("free (25 CUs)"));
        assert!(!svg.contains("more than one pod"));
    }

    #[test]
    fn rdna_shows_wgp_pairs_and_conflicts() {
        let a = CuSet::parse("0-3", 96).unwrap();
        let b = CuSet::parse("3-5", 96).unwrap();
        let svg = cu_map(
            96,
            &[CuOwner { pod: "a", cus: &a }, CuOwner { pod: "b", cus: &b }],
            Some(2),
            "rdna",
        );
        assert_eq!(count(&svg, "class=\"wgp\""), 48);
        assert!(svg.contains("data-cu-per-wgp=\"2\""));
        assert!(svg.contains("1 CUs are claimed by more than one pod (first: CU 3)"));
    }

    #[test]
    fn a_pod_keeps_its_colour_on_every_card_and_owners_of_one_card_differ() {
        let alone = owner_colours(&["ml/train"]);
        let shared = owner_colours(&["a/b", "ml/train", "team/near"]);
        assert_eq!(alone[0], shared[1], "the same colour beside other pods");
        let mut distinct = shared.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 3);
        // More owners than colours: every colour once before any repeats.
        let many: Vec<String> = (0..PALETTE.len()).map(|i| format!("ns/p-{i}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let mut all = owner_colours(&refs);
        all.sort();
        all.dedup();
        assert_eq!(all.len(), PALETTE.len());
        // The map draws each owner's cells and its legend entry in that colour.
        let set = CuSet::parse("0-3", 8).unwrap();
        let map = cu_map(
            8,
            &[CuOwner {
                pod: "ml/train",
                cus: &set,
            }],
            None,
            "map",
        );
        let id = format!("cu{:08x}", fnv("map") as u32);
        assert!(map.contains(&format!(
            "fill=\"{}\" data-cu=\"0\" data-owner=\"ml/train\"",
            alone[0]
        )));
        assert!(map.contains(&format!(
            "<pattern id=\"{id}-0\" patternUnits=\"userSpaceOnUse\" width=\"4\" height=\"4\" data-colour=\"{}\"",
            alone[0]
        )));
        assert!(map.contains(&format!(
            "data-pod=\"ml/train\" data-colour=\"{}\"",
            alone[0]
        )));
    }

    #[test]
    fn owners_of_one_card_differ_without_colour_and_the_legend_says_how() {
        // The first PATTERNS.len() owners of a card: each its own pattern, whatever they hash to.
        let names: Vec<String> = (0..PATTERNS.len())
            .map(|i| format!("team/job-{i}"))
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut patterns: Vec<usize> = owner_styles(&refs).iter().map(|s| s.pattern).collect();
        patterns.sort();
        patterns.dedup();
        assert_eq!(patterns.len(), PATTERNS.len());
        // A pod keeps its pattern beside others (it is its own, not its place).
        let alone = owner_styles(&["ml/train"])[0];
        assert_eq!(owner_styles(&["a/b", "ml/train"])[1].pattern, alone.pattern);
        // Drawn: a pattern per owner in the map's defs, its cells filled with it, the legend
        // naming it in words and showing it in its swatch.
        let a = CuSet::parse("0-9", 38).unwrap();
        let b = CuSet::parse("10-19", 38).unwrap();
        let map = cu_map(
            38,
            &[
                CuOwner {
                    pod: "ns/a",
                    cus: &a,
                },
                CuOwner {
                    pod: "ns/b",
                    cus: &b,
                },
            ],
            None,
            "card X",
        );
        let styles = owner_styles(&["ns/a", "ns/b"]);
        assert_ne!(styles[0].pattern, styles[1].pattern);
        let id = format!("cu{:08x}", fnv("card X") as u32);
        for (i, owner) in ["ns/a", "ns/b"].iter().enumerate() {
            let fill = format!("fill=\"url(#{id}-{i})\"");
            let p = styles[i].pattern();
            // Ten cells in its colour; its marks over those ten (none for "plain").
            let colour = format!("fill=\"{}\" data-cu=", styles[i].colour());
            assert_eq!(map.matches(&colour).count(), 10, "{map}");
            let marks = map
                .split("<path class=\"marks\" d=\"")
                .skip(1)
                .find(|m| m.contains(&fill));
            match marks {
                Some(m) => assert_eq!(m[..m.find('"').unwrap()].matches('z').count(), 10),
                None => assert_eq!(p, "plain", "{map}"),
            }
            let swatch = format!("<rect width=\"8\" height=\"8\" {fill}/>");
            assert_eq!(map.matches(&swatch).count(), 1);
            assert!(map.contains(&format!("data-pattern=\"{p}\">")), "{map}");
            assert!(map.contains(&format!("{owner} (10 CUs: ")), "{map}");
            assert!(map.contains(&format!("; {p})</li>")), "{map}");
        }
        // Ink that contrasts with its colour: white on the darkest, black on the lightest.
        assert!(
            pattern_def(
                "x",
                Style {
                    colour: 7,
                    pattern: 2
                }
            )
            .contains("fill=\"#fff\"")
        );
        assert!(
            pattern_def(
                "x",
                Style {
                    colour: 6,
                    pattern: 2
                }
            )
            .contains("fill=\"#000\"")
        );
        // Another map on the page has its own ids.
        let other = cu_map(
            38,
            &[CuOwner {
                pod: "ns/a",
                cus: &a,
            }],
            None,
            "card Y",
        );
        assert!(!other.contains(&id));
        // Past PATTERNS.len() owners the page says that patterns repeat.
        let sets: Vec<CuSet> = (0..8)
            .map(|i| CuSet::parse(&i.to_string(), 38).unwrap())
            .collect();
        let many: Vec<String> = (0..8).map(|i| format!("ns/p{i}")).collect();
        let owners: Vec<CuOwner> = many
            .iter()
            .zip(&sets)
            .map(|(pod, cus)| CuOwner { pod, cus })
            .collect();
        assert!(cu_map(38, &owners, None, "m").contains("8 pods share this card"));
    }
}
