//! What the mail managers (the mail gateway's and CoreMail's) share of SMTP submission: how a
//! service's mail client connects to a submission listener. A setting of either manager holds
//! it, and the service reads it from its `SMTP_TLS` variable.

use serde::{Deserialize, Serialize};

/// How a client connects to an SMTP submission listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SmtpTls {
    /// Plain TCP upgraded with STARTTLS.
    Starttls,
    /// TLS from the first byte.
    Tls,
    /// No TLS (a listener on a private network only).
    None,
}

impl SmtpTls {
    /// Its name as a setting and a variable carry it.
    pub fn as_str(self) -> &'static str {
        match self {
            SmtpTls::Starttls => "starttls",
            SmtpTls::Tls => "tls",
            SmtpTls::None => "none",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SmtpTls;

    #[test]
    fn a_mode_reads_as_the_name_it_is_set_by() {
        for mode in [SmtpTls::Starttls, SmtpTls::Tls, SmtpTls::None] {
            let set: SmtpTls = serde_json::from_value(serde_json::json!(mode.as_str())).unwrap();
            assert_eq!(set, mode);
        }
    }
}
