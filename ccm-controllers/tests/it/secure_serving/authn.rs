//! Delegated authentication (TokenReview) and authorisation (SubjectAccessReview): status
//! codes, always-allowed paths, unreachable reviewers, and the review caches.

use axum::http::StatusCode;
use ccm_controllers::secure_serving::SecureServingArgs;
use serde_json::{Value, json};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{MockApi, client_for, get_with, https, start, unreachable_url, write_kubeconfig};

#[tokio::test]
async fn request_without_token_gets_401() {
    let api = MockApi::start().await;
    let srv = start(SecureServingArgs::default(), api.client()).await;
    let (status, body) = get_with(&srv.url("/metrics"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "Unauthorized");
    // A non-bearer scheme counts as no credentials.
    let resp = https()
        .get(srv.url("/metrics"))
        .basic_auth("alice", Some("pw"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(api.token_reviews(), 0);
    assert_eq!(api.access_reviews(), 0);
    srv.stop().await;
}

#[tokio::test]
async fn invalid_token_gets_401() {
    let api = MockApi::start().await;
    let srv = start(SecureServingArgs::default(), api.client()).await;
    let (status, _) = get_with(&srv.url("/metrics"), Some("forged-token")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // A review that answers with an error is refused too.
    let (status, _) = get_with(&srv.url("/metrics"), Some("broken-token")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(api.token_reviews(), 2);
    assert_eq!(
        api.access_reviews(),
        0,
        "no authorisation without authentication"
    );
    srv.stop().await;
}

#[tokio::test]
async fn valid_token_of_allowed_subject_gets_200() {
    let api = MockApi::start().await;
    let srv = start(SecureServingArgs::default(), api.client()).await;
    let (status, body) = get_with(&srv.url("/metrics"), Some("alice-token")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, "# EOF\n");
    let review = api
        .state
        .last_access_review
        .lock()
        .unwrap()
        .clone()
        .unwrap();
    assert_eq!(review["apiVersion"], "authorization.k8s.io/v1");
    let spec = &review["spec"];
    assert_eq!(spec["user"], "alice");
    assert_eq!(spec["uid"], "uid-alice");
    assert_eq!(
        spec["groups"],
        json!(["team-a", "system:authenticated"]),
        "Go adds system:authenticated"
    );
    assert_eq!(
        spec["nonResourceAttributes"],
        json!({"path": "/metrics", "verb": "get"})
    );
    assert!(spec.get("resourceAttributes").is_none());
    srv.stop().await;
}

#[tokio::test]
async fn handler_sees_the_user_and_not_the_token() {
    let api = MockApi::start().await;
    let args = SecureServingArgs {
        authorization_always_allow_paths: vec!["/healthz".into()],
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    // Only alice may "get /metrics" in the mock; root is in system:masters and skips the review.
    let (status, body) = get_with(&srv.url("/whoami"), Some("root-token")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["user"], "root");
    assert_eq!(body["authorization_header"], false);
    assert_eq!(
        api.access_reviews(),
        0,
        "system:masters skips the SubjectAccessReview"
    );
    srv.stop().await;
}

#[tokio::test]
async fn denied_subject_gets_403() {
    let api = MockApi::start().await;
    let srv = start(SecureServingArgs::default(), api.client()).await;
    let (status, body) = get_with(&srv.url("/metrics"), Some("mallory-token")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["reason"], "Forbidden");
    assert_eq!(
        body["message"],
        "forbidden: User \"mallory\" cannot get path \"/metrics\""
    );
    // The verb is the lower-cased HTTP method, as Go's RequestInfo has it for non-resource paths.
    let resp = https()
        .post(srv.url("/metrics"))
        .bearer_auth("alice-token")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let review = api
        .state
        .last_access_review
        .lock()
        .unwrap()
        .clone()
        .unwrap();
    assert_eq!(review["spec"]["nonResourceAttributes"]["verb"], "post");
    srv.stop().await;
}

#[tokio::test]
async fn always_allowed_paths_skip_authentication_and_authorization() {
    let api = MockApi::start().await;
    let args = SecureServingArgs {
        authorization_always_allow_paths: vec!["/healthz".into(), "/who*".into()],
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    assert_eq!(get_with(&srv.url("/healthz"), None).await.0, StatusCode::OK);
    assert_eq!(get_with(&srv.url("/whoami"), None).await.0, StatusCode::OK);
    // Not in the list any more: /livez needs credentials now.
    assert_eq!(
        get_with(&srv.url("/livez"), None).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(api.token_reviews(), 0);
    assert_eq!(api.access_reviews(), 0);
    srv.stop().await;
}

#[tokio::test]
async fn default_always_allowed_paths_are_the_probes() {
    let api = MockApi::start().await;
    let srv = start(SecureServingArgs::default(), api.client()).await;
    assert_eq!(get_with(&srv.url("/healthz"), None).await.0, StatusCode::OK);
    assert_eq!(get_with(&srv.url("/livez"), None).await.0, StatusCode::OK);
    // /readyz is allowed too: the router has no such route, so it is 404, not 401.
    assert_eq!(
        get_with(&srv.url("/readyz"), None).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get_with(&srv.url("/nothing"), None).await.0,
        StatusCode::UNAUTHORIZED
    );
    srv.stop().await;
}

#[tokio::test]
async fn token_review_unreachable_refuses_with_401() {
    let api = MockApi::start().await;
    let down = unreachable_url().await;
    let args = SecureServingArgs {
        // The client-CA lookup would fail (and refuse to start) with this client.
        authentication_skip_lookup: true,
        ..SecureServingArgs::default()
    };
    let srv = start(args, client_for(&down)).await;
    let (status, _) = get_with(&srv.url("/metrics"), Some("alice-token")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // The failure is not cached as a verdict, and probes keep working.
    assert_eq!(get_with(&srv.url("/healthz"), None).await.0, StatusCode::OK);
    assert_eq!(api.token_reviews(), 0);
    srv.stop().await;
}

#[tokio::test]
async fn access_review_unreachable_refuses_with_500() {
    let api = MockApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let down = unreachable_url().await;
    let args = SecureServingArgs {
        authorization_kubeconfig: Some(write_kubeconfig(dir.path(), &down)),
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    let (status, body) = get_with(&srv.url("/metrics"), Some("alice-token")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert!(body.contains("authorization review failed"), "{body}");
    assert_eq!(
        api.token_reviews(),
        1,
        "authentication used the main client"
    );
    assert_eq!(api.access_reviews(), 0);
    srv.stop().await;
}

#[tokio::test]
async fn access_review_error_is_not_cached_and_never_lets_through() {
    let api = MockApi::start().await;
    api.state.fail_access_reviews.store(true, Ordering::SeqCst);
    let srv = start(SecureServingArgs::default(), api.client()).await;
    let (status, _) = get_with(&srv.url("/metrics"), Some("alice-token")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let failed = api.access_reviews();
    assert!(
        failed >= 2,
        "a 500 is retried (Go's webhook backoff): {failed}"
    );
    api.state.fail_access_reviews.store(false, Ordering::SeqCst);
    let (status, _) = get_with(&srv.url("/metrics"), Some("alice-token")).await;
    assert_eq!(status, StatusCode::OK, "the error was not cached");
    assert_eq!(api.access_reviews(), failed + 1);
    srv.stop().await;
}

#[tokio::test]
async fn authentication_kubeconfig_is_used_for_token_reviews() {
    let api = MockApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let down = unreachable_url().await;
    let args = SecureServingArgs {
        authentication_kubeconfig: Some(write_kubeconfig(dir.path(), &api.url)),
        authorization_kubeconfig: Some(write_kubeconfig(dir.path(), &api.url)),
        ..SecureServingArgs::default()
    };
    // The main client is unreachable: only the kubeconfigs can make this work.
    let srv = start(args, client_for(&down)).await;
    let (status, body) = get_with(&srv.url("/metrics"), Some("alice-token")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(api.token_reviews(), 1);
    assert_eq!(api.access_reviews(), 1);
    srv.stop().await;
}

#[tokio::test]
async fn reviews_are_cached_for_both_outcomes() {
    let api = MockApi::start().await;
    let srv = start(SecureServingArgs::default(), api.client()).await;
    for _ in 0..3 {
        assert_eq!(
            get_with(&srv.url("/metrics"), Some("alice-token")).await.0,
            StatusCode::OK
        );
    }
    assert_eq!(
        api.token_reviews(),
        1,
        "second and third requests hit the token cache"
    );
    assert_eq!(api.access_reviews(), 1, "and the authorized cache");
    for _ in 0..2 {
        assert_eq!(
            get_with(&srv.url("/metrics"), Some("mallory-token"))
                .await
                .0,
            StatusCode::FORBIDDEN
        );
    }
    assert_eq!(api.token_reviews(), 2);
    assert_eq!(
        api.access_reviews(),
        2,
        "the unauthorized decision is cached too"
    );
    for _ in 0..2 {
        assert_eq!(
            get_with(&srv.url("/metrics"), Some("forged-token")).await.0,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(api.token_reviews(), 3, "a rejected token is cached too");
    // Another path is another authorisation question, same token.
    assert_eq!(
        get_with(&srv.url("/whoami"), Some("alice-token")).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(api.token_reviews(), 3);
    assert_eq!(api.access_reviews(), 3);
    srv.stop().await;
}

#[tokio::test]
async fn cache_entries_expire_after_their_ttl() {
    let api = MockApi::start().await;
    let args = SecureServingArgs {
        authentication_token_webhook_cache_ttl: Duration::from_millis(200),
        authorization_webhook_cache_authorized_ttl: Duration::from_millis(200),
        authorization_webhook_cache_unauthorized_ttl: Duration::from_secs(600),
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    let ok = || async { get_with(&srv.url("/metrics"), Some("alice-token")).await.0 };
    assert_eq!(ok().await, StatusCode::OK);
    assert_eq!(
        get_with(&srv.url("/metrics"), Some("mallory-token"))
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    assert_eq!((api.token_reviews(), api.access_reviews()), (2, 2));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ok().await, StatusCode::OK);
    assert_eq!(
        (api.token_reviews(), api.access_reviews()),
        (3, 3),
        "alice's token and decision expired"
    );
    // mallory's token expired (one TTL for tokens), but the denial is still cached (600 s).
    assert_eq!(
        get_with(&srv.url("/metrics"), Some("mallory-token"))
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    assert_eq!((api.token_reviews(), api.access_reviews()), (4, 3));
    srv.stop().await;
}

#[tokio::test]
async fn zero_ttl_disables_the_caches() {
    let api = MockApi::start().await;
    let args = SecureServingArgs {
        authentication_token_webhook_cache_ttl: Duration::ZERO,
        authorization_webhook_cache_authorized_ttl: Duration::ZERO,
        authorization_webhook_cache_unauthorized_ttl: Duration::ZERO,
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    for _ in 0..2 {
        assert_eq!(
            get_with(&srv.url("/metrics"), Some("alice-token")).await.0,
            StatusCode::OK
        );
    }
    assert_eq!((api.token_reviews(), api.access_reviews()), (2, 2));
    srv.stop().await;
}
