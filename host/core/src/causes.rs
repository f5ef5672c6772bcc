//! Finding the cause of an error in its chain, and naming TLS failures (feature `tls`).

/// The error of type `T` somewhere in `e`'s chain of causes. (An `io::Error` wrapping one hides
/// it from `source()`, so it is opened by hand.)
pub fn find_cause<'e, T: std::error::Error + 'static>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e T> {
    let mut next = Some(e);
    for _ in 0..16 {
        let current = next?;
        if let Some(found) = current.downcast_ref::<T>() {
            return Some(found);
        }
        if let Some(inner) = current.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref) {
            if let Some(found) = inner.downcast_ref::<T>() {
                return Some(found);
            }
            next = Some(inner);
            continue;
        }
        next = current.source();
    }
    None
}

/// A stable kebab-case name for a TLS failure.
#[cfg(feature = "tls")]
pub fn tls_cause(e: &rustls::Error) -> &'static str {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => "certificate-unknown-issuer",
            C::Expired | C::ExpiredContext { .. } => "certificate-expired",
            C::NotValidYet | C::NotValidYetContext { .. } => "certificate-not-yet-valid",
            C::NotValidForName | C::NotValidForNameContext { .. } => "certificate-name-mismatch",
            C::Revoked => "certificate-revoked",
            C::BadSignature => "certificate-bad-signature",
            _ => "certificate-invalid",
        },
        rustls::Error::AlertReceived(_) => "alert-received",
        rustls::Error::NoCertificatesPresented => "certificate-missing",
        _ => "handshake-failed",
    }
}
