//! The page, inside the binary: `assets/index.html`, `app.js` and `style.css` (vanilla JS and
//! SVG; nothing is fetched from anywhere but this server).

/// One embedded file and the path it is served at.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: &'static str,
}

pub const ASSETS: [Asset; 3] = [
    Asset { path: "/", content_type: "text/html; charset=utf-8", body: include_str!("../assets/index.html") },
    Asset { path: "/app.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../assets/app.js") },
    Asset { path: "/style.css", content_type: "text/css; charset=utf-8", body: include_str!("../assets/style.css") },
];

/// The asset served at `path` (`/index.html` is `/`).
pub fn asset(path: &str) -> Option<&'static Asset> {
    let path = if path == "/index.html" { "/" } else { path };
    ASSETS.iter().find(|a| a.path == path)
}
