//! TokenReview and SubjectAccessReview on the in-process API server, through a `kube::Client`
//! as a delegating component calls them.

use ccm_testing::apiserver::ApiServer;
use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

async fn review_token(server: &ApiServer, token: &str) -> Result<TokenReview, kube::Error> {
    let api: Api<TokenReview> = Api::all(server.client());
    // From JSON: `spec.token` is optional up to Kubernetes 1.35 and required from 1.36 in
    // k8s-openapi.
    let review: TokenReview = serde_json::from_value(serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token},
    }))
    .unwrap();
    api.create(&PostParams::default(), &review).await
}

async fn review_access(
    server: &ApiServer,
    user: &str,
    groups: &[&str],
    verb: &str,
    path: &str,
) -> Result<SubjectAccessReview, kube::Error> {
    let api: Api<SubjectAccessReview> = Api::all(server.client());
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_owned()).filter(|u| !u.is_empty()),
            groups: Some(groups.iter().map(|g| (*g).to_owned()).collect()),
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(path.to_owned()),
                verb: Some(verb.to_owned()),
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    api.create(&PostParams::default(), &review).await
}

#[tokio::test]
async fn registered_tokens_authenticate_with_their_user_and_groups() {
    let server = ApiServer::start().await;
    server.add_token(
        "t-prom",
        "system:serviceaccount:monitoring:prometheus",
        &["scrapers"],
    );

    let review = review_token(&server, "t-prom").await.unwrap();
    let status = review.status.unwrap();
    assert_eq!(status.authenticated, Some(true));
    let user = status.user.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:monitoring:prometheus")
    );
    assert_eq!(
        user.groups.unwrap(),
        vec!["scrapers".to_owned(), "system:authenticated".to_owned()]
    );
    assert_eq!(status.error, None);

    let review = review_token(&server, "not-registered").await.unwrap();
    let status = review.status.unwrap();
    assert_ne!(status.authenticated, Some(true));
    assert_eq!(status.user.and_then(|u| u.username), None);
    assert_eq!(status.error, None, "an unknown token is not an error");
}

#[tokio::test]
async fn an_empty_token_is_a_bad_request() {
    let server = ApiServer::start().await;
    let err = review_token(&server, "").await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 400 && s.message.contains("token is required")),
        "{err:?}"
    );
}

#[tokio::test]
async fn access_reviews_follow_the_non_resource_rules() {
    let server = ApiServer::start().await;
    server.allow_non_resource("scrapers", "get", "/metrics");
    server.allow_non_resource("alice", "*", "/debug/*");

    let allowed = |r: SubjectAccessReview| r.status.unwrap().allowed;
    // By group.
    assert!(allowed(
        review_access(&server, "bob", &["scrapers"], "get", "/metrics")
            .await
            .unwrap()
    ));
    // Wrong verb, wrong path, subject without the group.
    assert!(!allowed(
        review_access(&server, "bob", &["scrapers"], "post", "/metrics")
            .await
            .unwrap()
    ));
    assert!(!allowed(
        review_access(&server, "bob", &["scrapers"], "get", "/metrics/x")
            .await
            .unwrap()
    ));
    let denied = review_access(&server, "bob", &["system:authenticated"], "get", "/metrics")
        .await
        .unwrap();
    let status = denied.status.unwrap();
    assert!(!status.allowed);
    assert!(status.reason.unwrap().contains("/metrics"));
    // By user, any verb, prefix path.
    assert!(allowed(
        review_access(&server, "alice", &[], "post", "/debug/pprof/heap")
            .await
            .unwrap()
    ));
    assert!(!allowed(
        review_access(&server, "alice", &[], "get", "/metrics")
            .await
            .unwrap()
    ));
}

#[tokio::test]
async fn invalid_access_reviews_are_refused_and_resource_access_is_never_granted() {
    let server = ApiServer::start().await;
    server.allow_non_resource("alice", "*", "*");
    let err = review_access(&server, "", &[], "get", "/metrics")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 422 && s.message.contains("at least one of user or group")),
        "{err:?}"
    );

    let api: Api<SubjectAccessReview> = Api::all(server.client());
    let resource_review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some("alice".into()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some("get".into()),
                resource: Some("nodes".into()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let answer = api
        .create(&PostParams::default(), &resource_review)
        .await
        .unwrap();
    assert!(!answer.status.unwrap().allowed);

    let neither = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some("alice".into()),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let err = api
        .create(&PostParams::default(), &neither)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 422 && s.message.contains("exactly one of")),
        "{err:?}"
    );
}

#[tokio::test]
async fn reviews_are_logged_and_can_fail_on_demand() {
    let server = ApiServer::start().await;
    server.add_token("t", "u", &[]);
    review_token(&server, "t").await.unwrap();
    review_access(&server, "u", &[], "get", "/metrics")
        .await
        .unwrap();
    let log = server.requests();
    let tr = log
        .iter()
        .find(|r| r.resource == "tokenreviews")
        .expect("the TokenReview is logged");
    assert_eq!(
        (tr.verb.as_str(), tr.group.as_str(), tr.status),
        ("create", "authentication.k8s.io", 201)
    );
    assert_eq!((tr.namespace.as_deref(), tr.name.as_deref()), (None, None));
    let sar = log
        .iter()
        .find(|r| r.resource == "subjectaccessreviews")
        .expect("the SubjectAccessReview is logged");
    assert_eq!(
        (sar.verb.as_str(), sar.group.as_str(), sar.status),
        ("create", "authorization.k8s.io", 201)
    );

    server.fail_next("create", "tokenreviews", 1, 500, None);
    let err = review_token(&server, "t").await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 500),
        "{err:?}"
    );
    assert_eq!(server.requests().last().map(|r| r.status), Some(500));
    // The fault was consumed: the next review works again.
    let ok = review_token(&server, "t").await.unwrap();
    assert_eq!(ok.status.unwrap().authenticated, Some(true));
}
