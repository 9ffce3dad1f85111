//! Reloading a running layer from a configuration file ([`ThrottleHandle::reload_config`]). Here,
//! above the handle, because the handle knows nothing of configuration files.

use std::fmt;

use crate::backend::Backend;
use crate::config::Config;
use crate::error::BuildError;
use crate::handle::ThrottleHandle;
use crate::key::KeySpec;

/// Reloading from a configuration file (feature `config`): its `[[route]]`s are the policies.
impl<B: Backend> ThrottleHandle<KeySpec, B> {
    /// Replaces the policies with the `[[route]]`s of `config` (their keys built with its
    /// `trusted_proxies` and `client_ip_header`), as [`reload`](Self::reload) does: an invalid
    /// route is an `Err` and the running policies stay in force. The rest of `config` is not read
    /// here: see [`reload_toml`](Self::reload_toml) to refuse changes that need a restart.
    pub fn reload_config(&self, config: &Config) -> Result<(), BuildError> {
        self.reload(config.policies()?)
    }

    /// Parses `toml` and, if it differs from `running` (the configuration the layer was built
    /// from) only in what a reload can apply, reloads its routes and returns it (keep it as the
    /// next `running`). A file that does not parse, an invalid route, or a change that needs a
    /// restart (`[backend]`, `listen`, the header options, `decision_extension`, the failure
    /// policy, `[access]`, `[overload]`, `[logging]`, `[admin]`, `[server]`, and
    /// `trusted_proxies` / `client_ip_header` while `[access]` uses them)
    /// is an `Err` naming it, and the running policies stay in force.
    ///
    /// ```
    /// use tower_throttle::config::Config;
    ///
    /// let text = |count| format!(
    ///     "[[route]]\nname = \"api\"\nkey = \"header:x-user-id\"\ncount = {count}\nperiod = \"1m\"\n"
    /// );
    /// let running = Config::from_toml(&text(10)).unwrap();
    /// let layer = running.memory_layer().unwrap();
    /// let handle = layer.handle();
    ///
    /// let running = handle.reload_toml(&running, &text(20)).unwrap();
    /// assert_eq!(layer.policies()[0].limit().quota().count(), 20);
    ///
    /// let err = handle.reload_toml(&running, &text(0)).unwrap_err();
    /// assert!(err.to_string().contains("count must be at least 1"), "{err}");
    /// let err = handle
    ///     .reload_toml(&running, &format!("[backend]\nkind = \"memory\"\nmax_keys = 10\n{}", text(5)))
    ///     .unwrap_err();
    /// assert!(err.to_string().contains("[backend]"), "{err}");
    /// assert_eq!(layer.policies()[0].limit().quota().count(), 20);
    /// ```
    pub fn reload_toml(&self, running: &Config, toml: &str) -> Result<Config, BuildError> {
        let config = Config::from_toml(toml).map_err(|e| BuildError::Invalid(e.to_string()))?;
        self.reload_config_checked(running, config)
    }

    /// Like [`reload_toml`](Self::reload_toml), with the configuration already parsed (for an
    /// application that adjusts it first, as the example server applies its `--redis` flag):
    /// refuses a change that needs a restart, else reloads `config`'s routes and returns it.
    pub fn reload_config_checked(
        &self,
        running: &Config,
        config: Config,
    ) -> Result<Config, BuildError> {
        if let Some(section) = needs_restart(running, &config) {
            return Err(BuildError::Invalid(format!(
                "{section} changed: it cannot be reloaded (restart to apply it); nothing was changed"
            )));
        }
        self.reload_config(&config)?;
        Ok(config)
    }
}

/// The first setting outside the routes that differs between `running` and `new`, if any.
fn needs_restart(running: &Config, new: &Config) -> Option<&'static str> {
    // Compared by their `Debug` form: the schema's types derive it (not `PartialEq`), and it
    // shows every field.
    let changed = |field: fn(&Config) -> &dyn fmt::Debug| {
        format!("{:?}", field(running)) != format!("{:?}", field(new))
    };
    let access_uses_proxies = running.access.is_some() || new.access.is_some();
    [
        ("[backend]", changed(|c| &c.backend)),
        ("listen", changed(|c| &c.listen)),
        ("ratelimit_headers", changed(|c| &c.ratelimit_headers)),
        ("legacy_headers", changed(|c| &c.legacy_headers)),
        ("decision_extension", changed(|c| &c.decision_extension)),
        ("on_backend_error", changed(|c| &c.on_backend_error)),
        ("[access]", changed(|c| &c.access)),
        ("[overload]", changed(|c| &c.overload)),
        // Key redaction is the layer's: a reload that turned it on would leave keys in clear.
        ("[logging]", changed(|c| &c.logging)),
        ("[admin]", changed(|c| &c.admin)),
        ("[server]", changed(|c| &c.server)),
        (
            "trusted_proxies (used by [access])",
            access_uses_proxies && changed(|c| &c.trusted_proxies),
        ),
        (
            "client_ip_header (used by [access])",
            access_uses_proxies && changed(|c| &c.client_ip_header),
        ),
    ]
    .into_iter()
    .find_map(|(section, changed)| changed.then_some(section))
}
