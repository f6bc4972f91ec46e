//! How AWS API errors become [`CloudError`]s.
//!
//! The framework's cloud-call budget (`--cloud-api-qps`) is the one place that rate-limits, so the
//! SDK makes exactly one attempt per request (see [`crate::clients`]) and every error comes here:
//! throttling and server-side (5xx) errors become [`CloudError::Retry`] with a delay, so that the
//! controller waits instead of retrying with its own backoff; everything else is
//! [`CloudError::Other`] with the AWS error code and message kept.

use std::time::Duration;

use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::display::DisplayErrorContext;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use ccm_core::CloudError;

/// How long to wait after AWS throttled a request (`Throttling`, `RequestLimitExceeded`, ...).
pub const THROTTLE_DELAY: Duration = Duration::from_secs(10);
/// How long to wait after an AWS server error (HTTP 5xx, `InternalError`, `Unavailable`).
pub const SERVER_ERROR_DELAY: Duration = Duration::from_secs(5);

/// The error codes AWS answers when a caller exceeds its request rate.
const THROTTLING_CODES: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "RequestThrottled",
    "SlowDown",
    "PriorRequestNotComplete",
    "EC2ThrottledException",
];

/// The error codes AWS answers for a transient failure on its side.
const SERVER_CODES: &[&str] = &[
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "Unavailable",
];

/// The AWS error code of a failed request, when AWS answered one.
pub(crate) fn code<E: ProvideErrorMetadata>(err: &SdkError<E, HttpResponse>) -> Option<&str> {
    match err {
        SdkError::ServiceError(_) => err.code(),
        _ => None,
    }
}

/// Maps a failed SDK request of `operation` to the framework's error.
pub(crate) fn to_cloud_error<E>(operation: &str, err: SdkError<E, HttpResponse>) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let status = err.raw_response().map(|r| r.status().as_u16());
    let code = code(&err).map(str::to_owned);
    let detail = DisplayErrorContext(&err).to_string();
    classify(operation, status, code.as_deref(), &detail)
}

/// The decision of [`to_cloud_error`], on plain values (unit-tested without HTTP).
pub(crate) fn classify(
    operation: &str,
    status: Option<u16>,
    code: Option<&str>,
    detail: &str,
) -> CloudError {
    let code_text = code.unwrap_or("no error code");
    if code.is_some_and(|c| THROTTLING_CODES.contains(&c)) || status == Some(429) {
        return CloudError::retry(
            THROTTLE_DELAY,
            format!("AWS throttled {operation} ({code_text}): {detail}"),
        );
    }
    if code.is_some_and(|c| SERVER_CODES.contains(&c)) || status.is_some_and(|s| s >= 500) {
        return CloudError::retry(
            SERVER_ERROR_DELAY,
            format!("AWS {operation} failed on the server side ({code_text}): {detail}"),
        );
    }
    CloudError::msg(format!("AWS {operation} failed ({code_text}): {detail}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttling_and_server_errors_are_retries_with_a_delay() {
        for (status, code, after) in [
            (Some(400), Some("Throttling"), THROTTLE_DELAY),
            (Some(503), Some("RequestLimitExceeded"), THROTTLE_DELAY),
            (Some(429), None, THROTTLE_DELAY),
            (Some(500), Some("InternalError"), SERVER_ERROR_DELAY),
            (Some(502), None, SERVER_ERROR_DELAY),
        ] {
            let err = classify("DescribeInstances", status, code, "detail");
            assert_eq!(err.retry_after(), Some(after), "{status:?} {code:?}: {err}");
        }
    }

    #[test]
    fn other_errors_keep_the_code() {
        let err = classify(
            "CreateRoute",
            Some(400),
            Some("InvalidParameterValue"),
            "bad CIDR",
        );
        assert_eq!(err.retry_after(), None);
        assert_eq!(
            err.to_string(),
            "AWS CreateRoute failed (InvalidParameterValue): bad CIDR"
        );
    }
}
