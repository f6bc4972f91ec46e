//! The authentication layer on its own: around any router, one review for concurrent requests
//! with one token.

use axum::http::StatusCode;
use ccm_controllers::secure_serving::SecureServingArgs;

use super::{MockApi, app, https, start};

#[tokio::test]
async fn layer_wraps_any_router() {
    use ccm_controllers::secure_serving::DelegatedAuth;
    use tower::ServiceExt;
    let api = MockApi::start().await;
    let auth =
        DelegatedAuth::new(&SecureServingArgs::default(), api.client(), api.client()).unwrap();
    let router = app().layer(auth.layer());
    let request = |token: Option<&str>| {
        let mut b = axum::http::Request::get("/metrics");
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        b.body(axum::body::Body::empty()).unwrap()
    };
    let status = |r: axum::response::Response| r.status();
    assert_eq!(
        status(router.clone().oneshot(request(None)).await.unwrap()),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        status(
            router
                .clone()
                .oneshot(request(Some("mallory-token")))
                .await
                .unwrap()
        ),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        status(
            router
                .clone()
                .oneshot(request(Some("alice-token")))
                .await
                .unwrap()
        ),
        StatusCode::OK
    );
}

#[tokio::test]
async fn concurrent_requests_with_one_token_make_one_review() {
    let api = MockApi::start().await;
    let srv = start(SecureServingArgs::default(), api.client()).await;
    let url = srv.url("/metrics");
    let client = https();
    let requests = (0..16).map(|_| {
        let req = client.get(&url).bearer_auth("alice-token");
        async move { req.send().await.unwrap().status() }
    });
    let statuses = futures::future::join_all(requests).await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );
    assert_eq!(
        api.token_reviews(),
        1,
        "concurrent lookups of one token are coalesced"
    );
    assert_eq!(api.access_reviews(), 1);
    srv.stop().await;
}
