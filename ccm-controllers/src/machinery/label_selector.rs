//! `--managed-node-selector`: a Kubernetes label selector in kubectl's `-l` syntax, parsed and
//! matched as apimachinery's `labels.Parse` does.
//!
//! Written by hand: kube's `Selector` matches but does not parse a selector string. The
//! in-process API server of `ccm-testing` parses `labelSelector` with this one too.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    /// `key=value` or `key==value`.
    Equal(String, String),
    /// `key!=value`: the label is absent or has another value.
    NotEqual(String, String),
    /// `key in (a,b)`.
    In(String, BTreeSet<String>),
    /// `key notin (a,b)`: the label is absent or has none of the values.
    NotIn(String, BTreeSet<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    DoesNotExist(String),
    /// `key>n`: the label is an integer greater than `n`.
    GreaterThan(String, i64),
    /// `key<n`: the label is an integer less than `n`.
    LessThan(String, i64),
}

impl Requirement {
    fn matches<'a>(&self, label: &impl Fn(&str) -> Option<&'a str>) -> bool {
        let int = |key: &str| label(key).and_then(|v| v.parse::<i64>().ok());
        match self {
            Requirement::Equal(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEqual(k, v) => label(k) != Some(v.as_str()),
            Requirement::In(k, set) => label(k).is_some_and(|v| set.contains(v)),
            Requirement::NotIn(k, set) => !label(k).is_some_and(|v| set.contains(v)),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::DoesNotExist(k) => label(k).is_none(),
            Requirement::GreaterThan(k, n) => int(k).is_some_and(|v| v > *n),
            Requirement::LessThan(k, n) => int(k).is_some_and(|v| v < *n),
        }
    }
}

/// The Nodes this cloud-controller-manager manages, as given to `--managed-node-selector`: a
/// Kubernetes label selector (`key=value`, `key==value`, `key!=value`, `key in (a,b)`,
/// `key notin (a,b)`, `key`, `!key`, `key>1`, `key<1`, joined by commas; every requirement
/// must hold). Nodes it does not select are foreign: no controller touches them (see
/// docs/controllers.md, "Which Nodes are ours"). An empty selector selects every Node.
///
/// ```
/// use ccm_controllers::ManagedNodeSelector;
///
/// let selector: ManagedNodeSelector = "node.example.com/cloud=acme,tier notin (edge)".parse()?;
/// let labels = [("node.example.com/cloud", "acme"), ("tier", "core")];
/// let label = |key: &str| labels.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
/// assert!(selector.matches(label));
/// assert!("tier in ()".parse::<ManagedNodeSelector>().is_err());
/// # Ok::<(), ccm_controllers::SelectorError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagedNodeSelector {
    text: String,
    requirements: Vec<Requirement>,
}

/// Why a label selector could not be parsed; the message names the requirement at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector {selector:?}: {problem}")]
pub struct SelectorError {
    selector: String,
    problem: String,
}

impl ManagedNodeSelector {
    /// Whether a Node with these labels is selected; `label(key)` is the Node's value of
    /// `key`, `None` when it has no such label.
    pub fn matches<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements.iter().all(|r| r.matches(&label))
    }

    /// Whether it selects every Node (the empty selector).
    pub fn selects_all(&self) -> bool {
        self.requirements.is_empty()
    }
}

impl fmt::Display for ManagedNodeSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for ManagedNodeSelector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let fail = |problem: String| SelectorError {
            selector: s.to_owned(),
            problem,
        };
        let mut requirements = Vec::new();
        if !s.trim().is_empty() {
            for part in split_top_level(s).map_err(&fail)? {
                requirements.push(parse_requirement(part.trim()).map_err(&fail)?);
            }
        }
        Ok(ManagedNodeSelector {
            text: s.trim().to_owned(),
            requirements,
        })
    }
}

/// Splits on the commas outside parentheses.
fn split_top_level(s: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0u32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' if depth == 0 => depth = 1,
            '(' => return Err("nested parentheses".into()),
            ')' if depth == 1 => depth = 0,
            ')' => return Err("')' without '('".into()),
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("'(' without ')'".into());
    }
    parts.push(&s[start..]);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    if part.is_empty() {
        return Err("empty requirement (two commas in a row, or a trailing comma)".into());
    }
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key_of(key.trim(), part)?));
    }
    for (op, make) in [
        (
            "!=",
            Requirement::NotEqual as fn(String, String) -> Requirement,
        ),
        ("==", Requirement::Equal),
        ("=", Requirement::Equal),
    ] {
        if let Some((key, value)) = part.split_once(op) {
            return Ok(make(
                key_of(key.trim(), part)?,
                value_of(value.trim(), part)?,
            ));
        }
    }
    for (op, make) in [
        (
            ">",
            Requirement::GreaterThan as fn(String, i64) -> Requirement,
        ),
        ("<", Requirement::LessThan),
    ] {
        if let Some((key, value)) = part.split_once(op) {
            let n = value.trim().parse::<i64>().map_err(|_| {
                format!("in {part:?}: {op} needs an integer, not {:?}", value.trim())
            })?;
            return Ok(make(key_of(key.trim(), part)?, n));
        }
    }
    if let Some(open) = part.find('(') {
        let (head, set) = part.split_at(open);
        let mut words = head.split_whitespace();
        let (Some(key), Some(op), None) = (words.next(), words.next(), words.next()) else {
            return Err(format!(
                "in {part:?}: expected `key in (...)` or `key notin (...)`"
            ));
        };
        let values = parse_set(set, part)?;
        let key = key_of(key, part)?;
        return match op {
            "in" => Ok(Requirement::In(key, values)),
            "notin" => Ok(Requirement::NotIn(key, values)),
            other => Err(format!(
                "in {part:?}: unknown operator {other:?} (expected in or notin)"
            )),
        };
    }
    Ok(Requirement::Exists(key_of(part, part)?))
}

fn parse_set(set: &str, part: &str) -> Result<BTreeSet<String>, String> {
    let inner = set
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("in {part:?}: text after the closing ')'"))?;
    if inner.trim().is_empty() {
        return Err(format!("in {part:?}: in and notin need at least one value"));
    }
    inner.split(',').map(|v| value_of(v.trim(), part)).collect()
}

/// A label key: a name of at most 63 characters, optionally after a DNS subdomain prefix and
/// a `/` (Kubernetes' qualified name).
fn key_of(key: &str, part: &str) -> Result<String, String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    });
    if name.is_empty() || !prefix_ok || !is_label_name(name) {
        return Err(format!(
            "in {part:?}: {key:?} is not a valid label key (an optional DNS subdomain and '/', then at most 63 characters: alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric)"
        ));
    }
    Ok(key.to_owned())
}

/// A label value: empty, or at most 63 characters of alphanumerics, `-`, `_` and `.`, starting
/// and ending with an alphanumeric.
fn value_of(value: &str, part: &str) -> Result<String, String> {
    if value.is_empty() || is_label_name(value) {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "in {part:?}: {value:?} is not a valid label value (at most 63 characters: alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric)"
        ))
    }
}

fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(s: &str) -> ManagedNodeSelector {
        s.parse().unwrap()
    }

    fn matches(s: &str, labels: &[(&str, &str)]) -> bool {
        sel(s).matches(|k| labels.iter().find(|(l, _)| *l == k).map(|(_, v)| *v))
    }

    #[test]
    fn parses_kubectl_syntax() {
        for s in [
            "a=b",
            "a==b",
            "a!=b",
            "a in (b, c)",
            "a notin (b)",
            "a",
            "!a",
            "a>1",
            "a < -2",
            "example.com/cloud=acme,tier notin (edge,gpu), !node.example.com/bare-metal",
            "a=",
            "",
            "  ",
        ] {
            assert!(s.parse::<ManagedNodeSelector>().is_ok(), "{s:?}");
        }
        assert!(sel("").selects_all());
        assert_eq!(sel(" a=b ").to_string(), "a=b");
    }

    #[test]
    fn rejects_bad_selectors_naming_the_problem() {
        for (s, says) in [
            ("a=b,", "empty requirement"),
            ("a in ()", "at least one value"),
            ("a in (b", "'(' without ')'"),
            ("a) ", "')' without '('"),
            ("a within (b)", "unknown operator"),
            ("a>x", "needs an integer"),
            ("-a=b", "not a valid label key"),
            ("Example.com/a=b", "not a valid label key"),
            ("a=b c", "not a valid label value"),
            ("a in (b) c", "text after"),
            ("a b", "not a valid label key"),
        ] {
            let e = s.parse::<ManagedNodeSelector>().unwrap_err().to_string();
            assert!(e.contains(says), "{s:?}: {e}");
            assert!(e.contains(&format!("{s:?}")), "{s:?}: {e}");
        }
    }

    #[test]
    fn matches_as_apimachinery() {
        let l = [("a", "b"), ("n", "5")];
        assert!(matches("a=b", &l));
        assert!(!matches("a=c", &l));
        assert!(matches("a!=c", &l));
        assert!(matches("x!=c", &l), "absent matches !=");
        assert!(matches("a in (b,c)", &l));
        assert!(!matches("x in (b)", &l));
        assert!(matches("x notin (b)", &l), "absent matches notin");
        assert!(!matches("a notin (b)", &l));
        assert!(matches("a", &l) && !matches("x", &l));
        assert!(matches("!x", &l) && !matches("!a", &l));
        assert!(matches("n>4", &l) && !matches("n>5", &l) && matches("n<6", &l));
        assert!(!matches("a>1", &l), "not an integer never matches");
        assert!(matches("a=b,n>1", &l) && !matches("a=b,n>9", &l));
        assert!(matches("", &l));
    }
}
