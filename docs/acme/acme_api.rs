// A stand-in for the Acme cloud's Rust SDK, used by the walkthrough in
// `docs/writing-a-provider.md` (its code blocks `include!` this file; they are doc tests of
// `ccm-controllers`). A real provider depends on its cloud's SDK crate instead: only this module
// changes, the provider code in the guide stays the same.
//
// The "account" lives in memory, shared by every client connected to the same endpoint, so a
// test can seed machines and the provider built from the cloud-config sees them.

/// The Acme cloud's API (an in-memory stand-in for the SDK crate `acme-api`).
pub mod acme_api {
    use std::collections::BTreeMap;
    use std::fmt;
    use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
    use std::time::Duration;

    /// A virtual machine.
    #[derive(Clone, Debug, PartialEq)]
    pub struct Machine {
        /// Acme's machine ID, e.g. `m-1001`.
        pub id: String,
        /// The machine's name; kubelet registers the Node under it.
        pub name: String,
        /// The zone, e.g. `fra-1a`.
        pub zone: String,
        /// The plan (machine type), e.g. `a1.small`.
        pub plan: String,
        /// The private address.
        pub private_ip: String,
        /// The public address, if the machine has one.
        pub public_ip: Option<String>,
        /// Running or stopped.
        pub state: MachineState,
    }

    /// The power state of a machine.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum MachineState {
        /// Running.
        Running,
        /// Stopped (it still exists and keeps its disks and addresses).
        Stopped,
    }

    /// A load balancer.
    #[derive(Clone, Debug, PartialEq, Default)]
    pub struct Balancer {
        /// Unique name in the account.
        pub name: String,
        /// Free-form tags.
        pub tags: BTreeMap<String, String>,
        /// Frontend ports.
        pub ports: Vec<i32>,
        /// Source CIDRs allowed to connect.
        pub allowed_sources: Vec<String>,
        /// Backend machines, by name.
        pub targets: Vec<String>,
        /// The public address; `None` while the balancer is being provisioned.
        pub address: Option<String>,
    }

    /// A route of the private network: `destination` is sent to the machine `next_hop`.
    #[derive(Clone, Debug, PartialEq)]
    pub struct NetworkRoute {
        /// Acme's route ID, e.g. `r-3`.
        pub id: String,
        /// The destination CIDR.
        pub destination: String,
        /// The name of the machine packets are sent to.
        pub next_hop: String,
        /// Free-form tags.
        pub tags: BTreeMap<String, String>,
        /// True when `next_hop` no longer exists.
        pub blackhole: bool,
    }

    /// What the API answers when a call fails.
    #[derive(Clone, Debug, PartialEq)]
    pub enum ApiError {
        /// The object does not exist (HTTP 404).
        NotFound,
        /// The object exists already (HTTP 409).
        AlreadyExists,
        /// Too many requests; try again after the delay (HTTP 429 with `Retry-After`).
        RateLimited {
            /// The `Retry-After` delay.
            retry_after: Duration,
        },
        /// The token is wrong or expired (HTTP 401).
        Unauthorized,
        /// Anything else (HTTP 5xx, network).
        Unavailable(String),
    }

    impl fmt::Display for ApiError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                ApiError::NotFound => f.write_str("acme: not found"),
                ApiError::AlreadyExists => f.write_str("acme: already exists"),
                ApiError::RateLimited { retry_after } => {
                    write!(f, "acme: rate limited, retry after {retry_after:?}")
                }
                ApiError::Unauthorized => f.write_str("acme: unauthorized"),
                ApiError::Unavailable(why) => write!(f, "acme: unavailable: {why}"),
            }
        }
    }

    impl std::error::Error for ApiError {}

    #[derive(Default)]
    struct Account {
        machines: BTreeMap<String, Machine>,
        balancers: BTreeMap<String, Balancer>,
        routes: BTreeMap<String, (String, NetworkRoute)>,
        next_id: u64,
    }

    static ACCOUNTS: LazyLock<Mutex<BTreeMap<String, Client>>> = LazyLock::new(Default::default);

    /// A client of one Acme account. Cheap to clone; clones share the connection.
    #[derive(Clone, Default)]
    pub struct Client {
        account: Arc<Mutex<Account>>,
    }

    impl fmt::Debug for Client {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("Client").finish_non_exhaustive()
        }
    }

    impl Client {
        /// Connects to the account behind `endpoint` with an API token.
        pub fn connect(endpoint: &str, token: &str) -> Result<Client, ApiError> {
            if token.is_empty() {
                return Err(ApiError::Unauthorized);
            }
            let mut accounts = ACCOUNTS.lock().unwrap_or_else(|e| e.into_inner());
            Ok(accounts.entry(endpoint.to_owned()).or_default().clone())
        }

        fn account(&self) -> MutexGuard<'_, Account> {
            self.account.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// A network round trip: every call yields once before it takes effect, so a caller
        /// that drops the future early changes nothing.
        async fn round_trip(&self) {
            tokio::task::yield_now().await;
        }

        /// Creates a machine (what the cloud console does; used by tests to seed the account).
        pub fn add_machine(&self, machine: Machine) {
            self.account().machines.insert(machine.id.clone(), machine);
        }

        /// Deletes a machine.
        pub fn remove_machine(&self, id: &str) {
            self.account().machines.remove(id);
        }

        /// `GET /machines/{id}`.
        pub async fn get_machine(&self, id: &str) -> Result<Machine, ApiError> {
            self.round_trip().await;
            self.account().machines.get(id).cloned().ok_or(ApiError::NotFound)
        }

        /// `GET /machines?name={name}`: the machine with this name, if any.
        pub async fn find_machine(&self, name: &str) -> Result<Option<Machine>, ApiError> {
            self.round_trip().await;
            Ok(self.account().machines.values().find(|m| m.name == name).cloned())
        }

        /// `GET /balancers/{name}`.
        pub async fn get_balancer(&self, name: &str) -> Result<Balancer, ApiError> {
            self.round_trip().await;
            self.account().balancers.get(name).cloned().ok_or(ApiError::NotFound)
        }

        /// `PUT /balancers/{name}`: creates or replaces; keeps the address of an existing one.
        pub async fn put_balancer(&self, mut balancer: Balancer) -> Result<Balancer, ApiError> {
            self.round_trip().await;
            let mut account = self.account();
            balancer.address = match account.balancers.get(&balancer.name) {
                Some(existing) => existing.address.clone(),
                None => {
                    account.next_id += 1;
                    Some(format!("192.0.2.{}", account.next_id % 250 + 1))
                }
            };
            account.balancers.insert(balancer.name.clone(), balancer.clone());
            Ok(balancer)
        }

        /// `PUT /balancers/{name}/targets`.
        pub async fn set_balancer_targets(
            &self,
            name: &str,
            targets: Vec<String>,
        ) -> Result<(), ApiError> {
            self.round_trip().await;
            let mut account = self.account();
            let balancer = account.balancers.get_mut(name).ok_or(ApiError::NotFound)?;
            balancer.targets = targets;
            Ok(())
        }

        /// `DELETE /balancers/{name}`: `NotFound` when there is none.
        pub async fn delete_balancer(&self, name: &str) -> Result<(), ApiError> {
            self.round_trip().await;
            self.account().balancers.remove(name).map(|_| ()).ok_or(ApiError::NotFound)
        }

        /// `GET /networks/{network}/routes`.
        pub async fn list_routes(&self, network: &str) -> Result<Vec<NetworkRoute>, ApiError> {
            self.round_trip().await;
            let account = self.account();
            Ok(account
                .routes
                .values()
                .filter(|(net, _)| net == network)
                .map(|(_, route)| {
                    let mut route = route.clone();
                    route.blackhole = !account.machines.values().any(|m| m.name == route.next_hop);
                    route
                })
                .collect())
        }

        /// `POST /networks/{network}/routes`: `AlreadyExists` when a route to `destination`
        /// exists.
        pub async fn create_route(
            &self,
            network: &str,
            destination: &str,
            next_hop: &str,
            tags: BTreeMap<String, String>,
        ) -> Result<NetworkRoute, ApiError> {
            self.round_trip().await;
            let mut account = self.account();
            let taken = account
                .routes
                .values()
                .any(|(net, r)| net == network && r.destination == destination);
            if taken {
                return Err(ApiError::AlreadyExists);
            }
            account.next_id += 1;
            let route = NetworkRoute {
                id: format!("r-{}", account.next_id),
                destination: destination.to_owned(),
                next_hop: next_hop.to_owned(),
                tags,
                blackhole: false,
            };
            account.routes.insert(route.id.clone(), (network.to_owned(), route.clone()));
            Ok(route)
        }

        /// `DELETE /networks/{network}/routes/{id}`: `NotFound` when there is none.
        pub async fn delete_route(&self, network: &str, id: &str) -> Result<(), ApiError> {
            self.round_trip().await;
            let mut account = self.account();
            match account.routes.get(id) {
                Some((net, _)) if net == network => {
                    account.routes.remove(id);
                    Ok(())
                }
                _ => Err(ApiError::NotFound),
            }
        }
    }
}
