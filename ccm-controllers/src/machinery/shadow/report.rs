//! The shadow's report: the current divergences as JSON (served on the secure port and
//! written by the one-shot mode) and a short human summary.

use std::io::Write;

use serde::Serialize;

use super::progress::NotCompared;
use super::{Divergence, Shadow};

/// The report: what `GET /shadow/divergences` answers and `--shadow-report` writes.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Report {
    /// When the report was made (RFC 3339).
    pub generated: String,
    /// The Nodes and Services the shadow's controllers compared (those in its informers, less
    /// the foreign Nodes and the objects not compared).
    pub objects_compared: ObjectsCompared,
    /// Planned changes to objects the incumbent is still reconciling.
    pub pending: usize,
    /// Every object the controllers queued was compared (a one-shot run cut off by
    /// `--shadow-settle-time` with objects not compared is not complete: exit code 4).
    pub complete: bool,
    /// The objects queued and not compared yet, sorted by kind and object, each with the
    /// reason (`cloud error` with the error, `budget saturated`, `still pending`).
    pub not_compared: Vec<NotCompared>,
    /// The current divergences, sorted by kind, object and field.
    pub divergences: Vec<Divergence>,
    /// The Nodes left to another cloud-controller-manager (their provider ID names another
    /// provider, or `--managed-node-selector` does not select them), sorted by name: never
    /// compared, so never a divergence.
    pub foreign_nodes: Vec<ForeignNode>,
}

/// A Node the shadow leaves to another cloud-controller-manager.
#[derive(Debug, Serialize)]
pub(crate) struct ForeignNode {
    /// The Node's name.
    pub name: String,
    /// Why: `providerID <scheme>` or `outside --managed-node-selector`.
    pub reason: String,
}

/// Objects compared, by kind.
#[derive(Debug, Serialize)]
pub(crate) struct ObjectsCompared {
    /// Nodes.
    pub nodes: usize,
    /// Services.
    pub services: usize,
}

impl Shadow {
    /// The report now.
    pub(crate) fn report(&self) -> Report {
        let (nodes, services) = self
            .stores
            .get()
            .map_or((0, 0), |(n, s)| (n.list().len(), s.list().len()));
        let foreign_nodes: Vec<ForeignNode> = self
            .ownership
            .get()
            .map(|o| o.foreign_nodes())
            .unwrap_or_default()
            .into_iter()
            .map(|(name, why)| ForeignNode {
                name,
                reason: why.to_string(),
            })
            .collect();
        let not_compared = self.not_compared_objects();
        let missing = |kind: &str| not_compared.iter().filter(|n| n.kind == kind).count();
        let (nodes, services) = (
            nodes.saturating_sub(missing("Node")),
            services.saturating_sub(missing("Service")),
        );
        Report {
            complete: not_compared.is_empty(),
            not_compared,
            generated: jiff::Timestamp::now().to_string(),
            objects_compared: ObjectsCompared {
                nodes: nodes.saturating_sub(foreign_nodes.len()),
                services,
            },
            pending: self.pending_count(),
            divergences: self.divergences(),
            foreign_nodes,
        }
    }
}

impl Report {
    /// A few lines for a person: the counts, then one line per divergence.
    pub(crate) fn write_summary(&self, out: &mut dyn Write) -> std::io::Result<()> {
        writeln!(
            out,
            "shadow: compared {} Nodes and {} Services; {} divergence(s), {} pending",
            self.objects_compared.nodes,
            self.objects_compared.services,
            self.divergences.len(),
            self.pending
        )?;
        if !self.complete {
            writeln!(
                out,
                "  INCOMPLETE: {} object(s) not compared:",
                self.not_compared.len()
            )?;
            for n in &self.not_compared {
                let error = n
                    .error
                    .as_deref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default();
                writeln!(out, "    {} {} ({}{error})", n.kind, n.object, n.reason)?;
            }
        }
        if !self.foreign_nodes.is_empty() {
            writeln!(
                out,
                "  {} foreign Node(s) left to another cloud-controller-manager, not compared:",
                self.foreign_nodes.len()
            )?;
            for n in &self.foreign_nodes {
                writeln!(out, "    {} ({})", n.name, n.reason)?;
            }
        }
        for d in &self.divergences {
            let also = if d.also.is_empty() {
                String::new()
            } else {
                format!(" (also {})", d.also.join(", "))
            };
            writeln!(
                out,
                "  {} {} {}{also}: incumbent {} / ours {} ({}, since {})",
                d.kind, d.object, d.field, d.incumbent, d.ours, d.controller, d.since
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_summary_names_each_divergence_with_both_values() {
        let report = Report {
            generated: "now".into(),
            objects_compared: ObjectsCompared {
                nodes: 3,
                services: 1,
            },
            pending: 0,
            complete: false,
            not_compared: vec![NotCompared {
                kind: "Service".into(),
                object: "ns/web".into(),
                reason: "cloud error".into(),
                error: Some("quota".into()),
            }],
            divergences: vec![Divergence {
                controller: "node-controller".into(),
                kind: "Node".into(),
                object: "n1".into(),
                field: "metadata.labels[topology.kubernetes.io/zone]".into(),
                also: vec!["metadata.labels[failure-domain.beta.kubernetes.io/zone]".into()],
                incumbent: json!("a"),
                ours: json!("b"),
                since: "t".into(),
            }],
            foreign_nodes: vec![ForeignNode {
                name: "metal-1".into(),
                reason: "providerID proxmox://".into(),
            }],
        };
        let mut out = Vec::new();
        assert!(report.write_summary(&mut out).is_ok());
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.contains("3 Nodes and 1 Services; 1 divergence(s)"),
            "{text}"
        );
        assert!(
            text.contains(
                "Node n1 metadata.labels[topology.kubernetes.io/zone] (also metadata.labels[failure-domain.beta.kubernetes.io/zone]): incumbent \"a\" / ours \"b\""
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "INCOMPLETE: 1 object(s) not compared:\n    Service ns/web (cloud error: quota)"
            ),
            "{text}"
        );
        assert!(
            text.contains("1 foreign Node(s) left to another cloud-controller-manager, not compared:\n    metal-1 (providerID proxmox://)"),
            "{text}"
        );
    }
}
