//! Object-storage bindings against a real S3 server checking credentials and IAM policies (moto
//! with `INITIAL_NO_AUTH_ACTION_COUNT`; `.ci/peers.sh` starts one): `CAPSTAN_TEST_S3_ADMIN_ENDPOINT`
//! and an admin key pair with S3 and IAM rights, `CAPSTAN_TEST_S3_ADMIN_ACCESS_KEY` and
//! `CAPSTAN_TEST_S3_ADMIN_SECRET_KEY`. Unset, the tests print why and pass — unless
//! `CAPSTAN_TEST_REQUIRE_S3_ADMIN` is set, then they fail.
//!
//! The unreachable endpoint and the endpoint without IAM (a stand-in answering S3's
//! `ListBuckets` and refusing IAM calls as S3-only servers do) need no server and always run.

use aws_sdk_s3::Client;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::ByteStream;
use capstan_storage::s3::{self, Admin, Granted};
use zeroize::Zeroizing;

const REGION: &str = "us-east-1";

/// The admin of the test server, or `None` (the test skips) when there is none.
fn admin() -> Option<Admin> {
    let vars = ["CAPSTAN_TEST_S3_ADMIN_ENDPOINT", "CAPSTAN_TEST_S3_ADMIN_ACCESS_KEY", "CAPSTAN_TEST_S3_ADMIN_SECRET_KEY"];
    let values: Vec<Option<String>> = vars.iter().map(|v| std::env::var(v).ok().filter(|s| !s.is_empty())).collect();
    let missing: Vec<&str> = vars.iter().zip(&values).filter(|(_, v)| v.is_none()).map(|(n, _)| *n).collect();
    if !missing.is_empty() {
        let reason = format!("{} not set", missing.join(", "));
        if std::env::var_os("CAPSTAN_TEST_REQUIRE_S3_ADMIN").is_some() {
            panic!("CAPSTAN_TEST_REQUIRE_S3_ADMIN is set but {reason}");
        }
        eprintln!("skipped: {reason} (.ci/peers.sh starts a moto server checking credentials)");
        return None;
    }
    let mut values = values.into_iter().map(Option::unwrap);
    Some(Admin {
        endpoint: values.next().unwrap().trim_end_matches('/').to_owned(),
        region: REGION.into(),
        access_key_id: values.next().unwrap(),
        secret_access_key: Zeroizing::new(values.next().unwrap()),
    })
}

/// A binding id of its own for each use: `t<random>_<what>`.
fn unique(what: &str) -> String {
    format!("t{:012x}_{what}", rand::random::<u64>() >> 16)
}

/// Drops the bindings it names when the test ends, passed or failed.
struct Cleanup {
    admin: Admin,
    ids: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (admin, ids) = (self.admin.clone(), std::mem::take(&mut self.ids));
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            for id in ids {
                if let Err(refusal) = runtime.block_on(s3::drop(&admin, &id)) {
                    eprintln!("cleaning up {id}: {refusal:?}");
                }
            }
        })
        .join()
        .unwrap();
    }
}

/// An S3 client with a key pair, the way a binding's service uses one.
fn client(endpoint: &str, access_key_id: &str, secret: &str) -> Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .credentials_provider(Credentials::new(access_key_id, secret, None, None, "test"))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .build();
    Client::from_conf(config)
}

fn iam(admin: &Admin) -> aws_sdk_iam::Client {
    let config = aws_sdk_iam::Config::builder()
        .behavior_version(aws_sdk_iam::config::BehaviorVersion::latest())
        .region(aws_sdk_iam::config::Region::new(REGION))
        .credentials_provider(Credentials::new(&admin.access_key_id, admin.secret_access_key.as_str(), None, None, "test"))
        .endpoint_url(&admin.endpoint)
        .build();
    aws_sdk_iam::Client::from_conf(config)
}

/// The access key ids of the binding's user.
async fn keys_of(admin: &Admin, id: &str) -> Vec<String> {
    let out = iam(admin).list_access_keys().user_name(s3::user_name(id).unwrap()).send().await.expect("the admin lists the keys");
    out.access_key_metadata().iter().filter_map(|k| k.access_key_id().map(str::to_owned)).collect()
}

/// Put then get an object with the key pair; the error code when refused.
async fn put_get(client: &Client, bucket: &str, key: &str) -> Result<Vec<u8>, String> {
    let body = format!("hello from {key}").into_bytes();
    client
        .put_object()
        .bucket(bucket)
        .key(key)
        .body(ByteStream::from(body.clone()))
        .send()
        .await
        .map_err(|e| e.code().unwrap_or("no code").to_owned())?;
    let out = client.get_object().bucket(bucket).key(key).send().await.map_err(|e| e.code().unwrap_or("no code").to_owned())?;
    let read = out.body.collect().await.expect("the body reads").into_bytes().to_vec();
    assert_eq!(read, body);
    Ok(read)
}

fn with(granted: &Granted) -> Client {
    assert!(!granted.secret_access_key.is_empty(), "a fresh key comes with its secret");
    client_for(granted, &granted.secret_access_key)
}

fn client_for(granted: &Granted, secret: &str) -> Client {
    let endpoint = std::env::var("CAPSTAN_TEST_S3_ADMIN_ENDPOINT").unwrap();
    client(endpoint.trim_end_matches('/'), &granted.access_key_id, secret)
}

#[tokio::test]
async fn a_binding_is_ensured_used_revoked_and_dropped() {
    let Some(admin) = admin() else { return };
    s3::check(&admin).await.expect("the admin passes the check");
    let (id, other) = (unique("life"), unique("other"));
    let _cleanup = Cleanup { admin: admin.clone(), ids: vec![id.clone(), other.clone()] };

    let first = s3::ensure(&admin, &id, None).await.expect("ensure");
    assert_eq!(first.bucket, s3::bucket_name(&id).unwrap());
    assert!(!first.secret_access_key.is_empty());
    let shown = format!("{first:?}");
    assert!(!shown.contains(first.secret_access_key.as_str()), "{shown}");
    // again, holding the key: the same key, no secret handed out
    let second = s3::ensure(&admin, &id, Some(&first.access_key_id)).await.expect("ensure again");
    assert_eq!(second.bucket, first.bucket);
    assert_eq!(second.access_key_id, first.access_key_id);
    assert!(second.secret_access_key.is_empty());
    assert_eq!(keys_of(&admin, &id).await, vec![first.access_key_id.clone()]);

    // the key works in its bucket
    let service = with(&first);
    put_get(&service, &first.bucket, "a/b.txt").await.expect("the granted key puts and gets in its bucket");
    let listed = service.list_objects_v2().bucket(&first.bucket).send().await.expect("the granted key lists its bucket");
    assert_eq!(listed.contents().len(), 1);

    // and nowhere else: not in another binding's bucket, not creating a bucket
    let theirs = s3::ensure(&admin, &other, None).await.expect("ensure the other binding");
    assert_eq!(put_get(&service, &theirs.bucket, "x").await.unwrap_err(), "AccessDenied");
    let read = service.get_object().bucket(&theirs.bucket).key("x").send().await.unwrap_err();
    assert_eq!(read.code(), Some("AccessDenied"));
    let created = service.create_bucket().bucket(format!("capstan-{}", unique("rogue").replace('_', "-"))).send().await.unwrap_err();
    assert_eq!(created.code(), Some("AccessDenied"));
    assert_eq!(put_get(&with(&theirs), &theirs.bucket, "x").await.unwrap(), b"hello from x");
    assert_eq!(put_get(&with(&theirs), &first.bucket, "y").await.unwrap_err(), "AccessDenied");

    // revoked: refused at once, the data stays
    s3::revoke(&admin, &id).await.expect("revoke");
    assert!(keys_of(&admin, &id).await.is_empty());
    let refused = service.get_object().bucket(&first.bucket).key("a/b.txt").send().await.unwrap_err();
    assert_eq!(refused.code(), Some("InvalidAccessKeyId"), "{refused:?}");
    s3::revoke(&admin, &id).await.expect("revoke again");
    // a key revoked is no key held: ensure hands out a new one
    let renewed = s3::ensure(&admin, &id, Some(&first.access_key_id)).await.expect("ensure after revoke");
    assert_ne!(renewed.access_key_id, first.access_key_id);
    let read = with(&renewed).get_object().bucket(&first.bucket).key("a/b.txt").send().await.expect("the data stayed");
    assert_eq!(read.body.collect().await.unwrap().into_bytes().as_ref(), b"hello from a/b.txt");

    // dropped: bucket (with its objects) and user gone; again is fine
    for n in 0..5 {
        put_get(&with(&renewed), &first.bucket, &format!("more/{n}")).await.unwrap();
    }
    s3::drop(&admin, &id).await.expect("drop");
    let admin_s3 = client(&admin.endpoint, &admin.access_key_id, &admin.secret_access_key);
    let head = admin_s3.head_bucket().bucket(&first.bucket).send().await.unwrap_err();
    assert_eq!(head.raw_response().map(|r| r.status().as_u16()), Some(404), "{head:?}");
    let user = iam(&admin).get_user().user_name(s3::user_name(&id).unwrap()).send().await.unwrap_err();
    assert_eq!(user.code(), Some("NoSuchEntity"));
    s3::drop(&admin, &id).await.expect("drop again");
    s3::revoke(&admin, &id).await.expect("revoke what is gone");
    // the other binding is untouched
    assert_eq!(put_get(&with(&theirs), &theirs.bucket, "z").await.unwrap(), b"hello from z");
}

#[tokio::test]
async fn ensure_after_a_crash_leaves_one_working_key() {
    let Some(admin) = admin() else { return };
    let id = unique("crash");
    let _cleanup = Cleanup { admin: admin.clone(), ids: vec![id.clone()] };
    let lost = s3::ensure(&admin, &id, None).await.expect("ensure");
    // the caller crashed before keeping the secret: it asks again holding nothing
    let kept = s3::ensure(&admin, &id, None).await.expect("ensure after the crash");
    assert_ne!(kept.access_key_id, lost.access_key_id);
    assert!(!kept.secret_access_key.is_empty());
    assert_eq!(keys_of(&admin, &id).await, vec![kept.access_key_id.clone()]);
    put_get(&with(&kept), &kept.bucket, "k").await.expect("the new key works");
    assert_eq!(put_get(&with(&lost), &kept.bucket, "k").await.unwrap_err(), "InvalidAccessKeyId");
    // a held key id that is not the user's is no key held
    let again = s3::ensure(&admin, &id, Some(&lost.access_key_id)).await.expect("ensure holding a deleted key");
    assert!(!again.secret_access_key.is_empty());
    assert_eq!(keys_of(&admin, &id).await, vec![again.access_key_id.clone()]);

    // a crash between creating the user and its policy, or the bucket and the user: resumed
    s3::drop(&admin, &id).await.expect("drop");
    iam(&admin).create_user().user_name(s3::user_name(&id).unwrap()).send().await.expect("a user left behind");
    let resumed = s3::ensure(&admin, &id, None).await.expect("ensure resumes");
    put_get(&with(&resumed), &resumed.bucket, "r").await.expect("the resumed binding works");
}

#[tokio::test]
async fn a_wrong_admin_secret_is_rejected() {
    let Some(admin) = admin() else { return };
    let wrong = Admin { secret_access_key: Zeroizing::new("not-the-secret-at-all".into()), ..admin.clone() };
    let refusal = s3::check(&wrong).await.unwrap_err();
    assert!(refusal.is("objectstorage-admin-rejected"), "{refusal:?}");
    let shown = format!("{refusal:?}");
    assert!(!shown.contains("not-the-secret") && !shown.contains(admin.secret_access_key.as_str()), "{shown}");
    let refusal = s3::ensure(&wrong, &unique("wrong"), None).await.unwrap_err();
    assert!(refusal.is("objectstorage-admin-rejected"), "{refusal:?}");
    let unknown = Admin { access_key_id: "AKIANOSUCHKEY0000000".into(), ..admin.clone() };
    assert!(s3::check(&unknown).await.unwrap_err().is("objectstorage-admin-rejected"));
    let refusal = s3::revoke(&wrong, &unique("wrong")).await.unwrap_err();
    assert!(refusal.is("objectstorage-admin-rejected"), "{refusal:?}");
}

#[tokio::test]
async fn an_endpoint_nobody_listens_on_is_unreachable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let admin = Admin {
        endpoint: format!("http://127.0.0.1:{port}"),
        region: REGION.into(),
        access_key_id: "AKIAEXAMPLE".into(),
        secret_access_key: Zeroizing::new("secret".into()),
    };
    let refusal = s3::check(&admin).await.unwrap_err();
    assert!(refusal.is("objectstorage-endpoint-unreachable"), "{refusal:?}");
    assert!(refusal.retryable);
    let refusal = s3::ensure(&admin, "t_unreachable", None).await.unwrap_err();
    assert!(refusal.is("objectstorage-endpoint-unreachable"), "{refusal:?}");
    let bad = Admin { endpoint: format!("http://127.0.0.1:{port}/"), ..admin };
    assert!(s3::check(&bad).await.unwrap_err().is("objectstorage-endpoint-invalid"));
}

/// A stand-in for an endpoint that speaks S3 but no IAM (as MinIO, Garage, Ceph's RGW without
/// its IAM API): `ListBuckets` answers an empty list, every `POST /` (an IAM call) gets `iam`
/// — status and body. Answers until the test ends.
async fn s3_without_iam(iam: (u16, String)) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            let iam = iam.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                // the head, then as much body as it announces
                let (head, body_len) = loop {
                    let Ok(n) = stream.read(&mut buf).await else { return };
                    if n == 0 {
                        return;
                    }
                    request.extend_from_slice(&buf[..n]);
                    if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&request[..end]).to_lowercase();
                        let len = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap_or(0)))
                            .unwrap_or(0);
                        break (head, end + 4 + len);
                    }
                };
                while request.len() < body_len {
                    let Ok(n) = stream.read(&mut buf).await else { return };
                    if n == 0 {
                        break;
                    }
                    request.extend_from_slice(&buf[..n]);
                }
                let (status, body) = if head.starts_with("get /") {
                    (
                        200,
                        r#"<?xml version="1.0" encoding="UTF-8"?><ListAllMyBucketsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Owner><ID>o</ID><DisplayName>o</DisplayName></Owner><Buckets></Buckets></ListAllMyBucketsResult>"#.to_owned(),
                    )
                } else {
                    iam
                };
                let answer = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/xml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    endpoint
}

#[tokio::test]
async fn an_endpoint_without_iam_cannot_make_users() {
    let s3_error = |code: &str| {
        format!(r#"<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>no</Message><Resource>/</Resource></Error>"#)
    };
    let answers = [
        (501, s3_error("NotImplemented")),
        (405, s3_error("MethodNotAllowed")),
        // a server that checks signatures for S3 only
        (403, s3_error("SignatureDoesNotMatch")),
        // one that answers anything with a bucket listing
        (200, "<ListAllMyBucketsResult><Buckets></Buckets></ListAllMyBucketsResult>".to_owned()),
    ];
    for answer in answers {
        let status = answer.0;
        let admin = Admin {
            endpoint: s3_without_iam(answer).await,
            region: REGION.into(),
            access_key_id: "AKIAEXAMPLE".into(),
            secret_access_key: Zeroizing::new("secret".into()),
        };
        let refusal = s3::check(&admin).await.unwrap_err();
        assert!(refusal.is("objectstorage-users-unsupported"), "{status}: {refusal:?}");
        assert!(refusal.message.contains("limited to one bucket"), "{}", refusal.message);
    }
}
