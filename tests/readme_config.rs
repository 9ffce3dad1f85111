//! The configuration documented in the README parses and builds as written.

use tower_throttle::config::Config;

#[test]
fn the_readme_config_reference_is_valid() {
    let readme = include_str!("../README.md");
    let section = &readme[readme
        .find("## Configuration")
        .expect("README has a configuration section")..];
    let start = section.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let toml = &section[start..start + section[start..].find("```").unwrap()];
    let config = Config::from_toml(toml).unwrap();
    let layer = config.memory_layer().unwrap();
    let reply = &layer.policies()[0];
    assert_eq!(reply.limit().name(), "reply");
    assert_eq!(reply.limit().quota().limit(), 16);
    assert_eq!(reply.route(), Some("/reply"));
    assert_eq!(config.listen, Some("127.0.0.1:3000".parse().unwrap()));
}
