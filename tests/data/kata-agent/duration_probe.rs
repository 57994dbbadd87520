// Which TOML spellings of a std::time::Duration field serde accepts (see README.md here).
use serde::Deserialize;
use std::time::Duration;
#[derive(Debug, Deserialize)]
struct B { cdi_timeout: Option<Duration>, server_addr: Option<String> }
fn main() {
    for s in ["cdi_timeout = 100", "cdi_timeout = { secs = 100, nanos = 0 }", "cdi_timeout = { secs = 100 }",
              "cdi_timeout = [100, 0]", "cdi_timeout = \"100s\"", "server_addr = 'x'", "cdi_timeout = 1.5",
              "cdi_timeout = { secs = 100, nanos = 0, extra = 1 }", "cdi_timeout = { secs = 0, nanos = 0 }"] {
        let r: Result<B, _> = toml::from_str(s);
        println!("{:50} -> {:?}", s, r.map(|b| b.cdi_timeout).map_err(|e| e.to_string()));
    }
}
