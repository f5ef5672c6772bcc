//! First-party plugins: bundles the host binary embeds (the binary crate hands them to
//! [`crate::host::PluginHost::new`]). They are trusted because the binary carries them — an
//! unsigned bundle is first-party only when it is byte for byte one of these — and they still
//! run sandboxed with exactly the capabilities they declare.

/// The publisher a first-party plugin's registry record names.
pub const PUBLISHER: &str = "first-party";

/// Who installs and upgrades them: the host itself, at start.
pub const INSTALLER: &str = "capstan";
