/// Maps an Acme API error onto the provider contract's error.
///
/// "Not found" is *not* mapped here: what it means depends on the call (an instance that is gone
/// is `Ok(false)` for `instance_exists`, a load balancer that is gone is success for
/// `ensure_load_balancer_deleted`), so each method handles it before calling this.
fn cloud_error(error: ApiError) -> CloudError {
    match error {
        // The cloud says when to come back: the framework requeues after exactly that delay,
        // without counting a failure or emitting a warning event.
        ApiError::RateLimited { retry_after } => {
            CloudError::retry(retry_after, "Acme API rate limit")
        }
        // Everything else is a failure the framework retries with backoff; keep the source.
        other => CloudError::other(other),
    }
}
