use acme_api::{Client, Machine, MachineState};
use acme_cloud::{balancer_name, build_acme};
use ccm_core::{Node, ObjectMeta};
use ccm_testing::builders::load_balancer_service;
use ccm_testing::conformance::{Check, ConformanceInput, Suite};

const CLUSTER: &str = "conformance";

fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        ..Default::default()
    }
}

fn machine(id: &str, name: &str, state: MachineState) -> Machine {
    Machine {
        id: id.into(),
        name: name.into(),
        zone: "fra-1a".into(),
        plan: "a1.small".into(),
        private_ip: format!("10.0.0.{}", id.trim_start_matches("m-")),
        public_ip: None,
        state,
    }
}

/// The suite for the Acme provider on its own in-memory `account` (tests run in parallel, so
/// each gets its own), with `skip` left out.
fn acme_suite(account: &str, skip: &[Check]) -> Suite {
    // The account: two running machines and a stopped one; "gone-1" has no machine.
    let endpoint = format!("memory://{account}");
    let api = Client::connect(&endpoint, "test-token").unwrap();
    api.add_machine(machine("m-1", "worker-1", MachineState::Running));
    api.add_machine(machine("m-2", "worker-2", MachineState::Running));
    api.add_machine(machine("m-3", "stopped-1", MachineState::Stopped));

    let config = format!("endpoint: {endpoint}\ntoken: test-token\nnetwork: pods\n");
    let provider = build_acme(Some(config.as_bytes())).unwrap();

    // A Service the suite may create a load balancer for (namespace, name, uid and ports set).
    let mut service = load_balancer_service("default", "conformance-lb").build();
    service.metadata.uid = Some("6f1d3c2a-0000-4000-8000-00000000a001".into());

    let input = ConformanceInput::new(CLUSTER, vec![node("worker-1"), node("worker-2")])
        .missing_node(node("gone-1"))
        .shutdown_node(node("stopped-1"))
        .service(service)
        .route_cidr("10.244.250.0/24")
        // For the dual-stack check: an IPv6 route next to an IPv4 one under the same name hint.
        .ipv6_route_cidr("fd00:10:244:fa::/64")
        // Lets the suite see that update_load_balancer really changed the backends.
        .lb_hosts_probe(move |svc| {
            let api = api.clone();
            async move {
                let balancer = api.get_balancer(&balancer_name(CLUSTER, &svc)).await.ok()?;
                Some(balancer.targets)
            }
        });
    let mut suite = Suite::new(provider, input);
    for check in skip {
        suite = suite.skip(*check);
    }
    suite
}

#[tokio::test]
async fn acme_keeps_the_provider_contract() {
    let report = acme_suite("contract", &[]).run().await;
    println!("{report}");
    report.assert_success(); // panics with the whole report if a check failed
}

#[tokio::test]
async fn load_balancer_checks_one_by_one() {
    // E.g. the test account allows one load balancer at a time: no parallel ensures.
    let suite = acme_suite("one-by-one", &[Check::ConcurrentCallsAreSafe]);
    for check in [
        Check::EnsureLoadBalancerIdempotentWithIngress,
        Check::GetLoadBalancerReportsExactlyBetweenEnsureAndDelete,
        Check::UpdateLoadBalancerChangesHosts,
        Check::EnsureLoadBalancerDeletedIdempotent,
        Check::ConcurrentCallsAreSafe,
    ] {
        let result = suite.run_check(check).await;
        assert!(!result.outcome.is_failed(), "{result}");
    }
}
