//! The docs against the code: every relative link resolves, and every path,
//! route, symbol, field or variable that the prose names in `inline code`
//! still exists. Reads the README, the guide (`docs/guide/src`), LAB.md and
//! the lock library's README; a rename in the code fails this test until
//! the docs follow.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where the code lives: what the docs may name.
const CODE_DIRS: &[&str] = &[
    "src",
    "lua",
    "migrations",
    "tests",
    "lab",
    "loadtest",
    "redis-locks",
    "testkit",
    "scripts",
    "deploy",
    ".ci",
];
const CODE_EXTENSIONS: &[&str] = &["rs", "lua", "sql", "sh", "toml", "js", "yml", "json"];

/// Crates the docs may name paths in without this project defining them.
const FOREIGN_CRATES: &[&str] = &[
    "std",
    "core",
    "tokio",
    "tokio_util",
    "sqlx",
    "redis",
    "axum",
    "serde",
    "serde_json",
    "tower",
    "tower_http",
    "utoipa",
    "hyper",
    "chrono",
    "uuid",
    "tracing",
    "metrics",
    "clap",
    "futures",
    "deadpool_redis",
    "hdrhistogram",
];

/// Names of other systems' settings that the prose may name.
const FOREIGN_NAMES: &[&str] = &["synchronous_commit", "max_connections", "shared_buffers"];

/// What the code defines and says, read once.
struct Code {
    /// Every identifier-like word in the code.
    words: HashSet<String>,
    /// Names of items: fns, types, consts, modules, enum variants.
    items: HashSet<String>,
    /// Routes as `METHOD /path`, with every `{param}` written `{}`.
    routes: HashSet<String>,
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && name != "node_modules" && !name.starts_with('.') {
                files_under(&path, out);
            }
        } else {
            out.push(path);
        }
    }
}

fn words_of(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
}

/// `{voucher_id}` and `{id}` alike: routes compare by shape.
fn route_shape(path: &str) -> String {
    let path = path.split('?').next().unwrap_or(path);
    let mut out = String::new();
    let mut in_param = false;
    for c in path.chars() {
        match c {
            '{' => {
                in_param = true;
                out.push_str("{}");
            }
            '}' => in_param = false,
            _ if !in_param => out.push(c),
            _ => {}
        }
    }
    out.trim_end_matches('/').to_owned()
}

impl Code {
    fn read(root: &Path) -> Self {
        let mut files = Vec::new();
        for dir in CODE_DIRS {
            files_under(&root.join(dir), &mut files);
        }
        files.push(root.join("Cargo.toml"));
        files.push(root.join("docker-compose.yml"));
        let mut code = Code {
            words: HashSet::new(),
            items: HashSet::new(),
            routes: HashSet::new(),
        };
        for file in files {
            let ext = file.extension().and_then(|e| e.to_str()).unwrap_or("");
            if !CODE_EXTENSIONS.contains(&ext) && file.parent() != Some(&root.join(".ci")) {
                continue;
            }
            // This file names stale things on purpose.
            if file.ends_with("tests/docs.rs") {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            code.learn(&text, ext == "rs");
        }
        code
    }

    fn learn(&mut self, text: &str, rust: bool) {
        self.words.extend(words_of(text).map(str::to_owned));
        if !rust {
            return;
        }
        const KEYWORDS: &[&str] = &[
            "fn",
            "struct",
            "enum",
            "trait",
            "type",
            "const",
            "static",
            "mod",
            "union",
            "macro_rules!",
        ];
        for line in text.lines() {
            let mut tokens = line.split_whitespace().peekable();
            while let Some(token) = tokens.next() {
                if KEYWORDS.contains(&token) {
                    if let Some(name) = tokens.peek().and_then(|n| words_of(n).next()) {
                        self.items.insert(name.to_owned());
                    }
                }
            }
            // Enum variants (and struct fields): a capitalised word opening
            // a line and followed by `,`, `(`, `{` or `=`.
            let trimmed = line.trim_start();
            if let Some(first) = words_of(trimmed).next().filter(|w| trimmed.starts_with(w)) {
                let rest = trimmed[first.len()..].trim_start();
                if first.starts_with(|c: char| c.is_ascii_uppercase())
                    && (rest.starts_with([',', '(', '{']) || rest.starts_with("= "))
                {
                    self.items.insert(first.to_owned());
                }
            }
            // Fields: `pub name: Type,` (and, loosely, parameters).
            let field = trimmed
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ");
            if let Some((name, _)) = field.split_once(": ") {
                if is_ident(name) {
                    self.items.insert(name.to_owned());
                }
            }
            // A handler's annotation, which the route table serves:
            // `#[utoipa::path(\n    post, path = "/admin/vouchers", ...`.
            for method in ["get", "post", "put", "delete", "patch"] {
                let head = format!("{method}, path = \"");
                if let Some(after) = trimmed.strip_prefix(head.as_str()) {
                    if let Some(end) = after.find('"') {
                        let path = route_shape(&after[..end]);
                        self.routes
                            .insert(format!("{} {path}", method.to_uppercase()));
                        self.routes.insert(format!("ANY {path}"));
                    }
                }
            }
            // `.route("/path", get(..).post(..))`, and the table's routes
            // outside the description: `.plain(class, "/path", get(..))`.
            let route_at = line.find(".route(\"").map(|at| at + 8).or_else(|| {
                let at = line.find(".plain(")?;
                Some(at + line[at..].find('"')? + 1)
            });
            if let Some(at) = route_at {
                let after = &line[at..];
                if let Some(end) = after.find('"') {
                    let path = route_shape(&after[..end]);
                    for method in ["get", "post", "put", "delete", "patch"] {
                        if after.contains(&format!("{method}(")) {
                            self.routes
                                .insert(format!("{} {path}", method.to_uppercase()));
                        }
                    }
                    self.routes.insert(format!("ANY {path}"));
                }
            }
        }
    }
}

/// One thing a doc names that the code does not have.
#[derive(Debug, PartialEq)]
struct Stale {
    doc: String,
    line: usize,
    what: String,
}

fn is_ident(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Why `span` (the text of an inline code span) names nothing that
/// exists, or `None` if it does or is not a name this check reads.
fn check_span(span: &str, doc_dir: &Path, root: &Path, code: &Code) -> Option<String> {
    let span = span.trim();
    // A route: `POST /seckill/{voucher_id}`.
    if let Some((method, path)) = span.split_once(' ') {
        if ["GET", "POST", "PUT", "DELETE", "PATCH"].contains(&method) && path.starts_with('/') {
            let route = format!("{method} {}", route_shape(path));
            return (!code.routes.contains(&route)).then(|| format!("route {span}"));
        }
    }
    if span.contains(char::is_whitespace) || span.contains('*') || FOREIGN_NAMES.contains(&span) {
        return None;
    }
    // A bare route path whose first segment is a route's.
    if let Some(rest) = span.strip_prefix('/') {
        let first = rest.split(['/', '?']).next().unwrap_or("");
        let known_root = code.routes.iter().any(|r| {
            r.split(' ')
                .nth(1)
                .is_some_and(|p| p.split('/').nth(1) == Some(first))
        });
        if !first.is_empty() && known_root {
            let shape = format!("ANY {}", route_shape(span));
            return (!code.routes.contains(&shape)).then(|| format!("route {span}"));
        }
        return None;
    }
    // A path in the repository.
    let top = span.split('/').next().unwrap_or("");
    // What a build writes (`target/guide/index.html`) is not in the tree.
    if top == "target" {
        return None;
    }
    let looks_like_path = span.contains('/')
        && !span.contains("://")
        && !span.contains(['*', '{', '<', '$', '='])
        && (CODE_DIRS.contains(&top.trim_start_matches("./"))
            || ["docs", "loadtest"].contains(&top)
            || Path::new(span).extension().is_some());
    if looks_like_path {
        let exists = root.join(span).exists() || doc_dir.join(span).exists();
        return (!exists).then(|| format!("path {span}"));
    }
    // A symbol: `store::Store`, `Seckill::purchase`, `LockGuard::lost()`.
    let symbol = span.trim_end_matches("()");
    if symbol.contains("::") && symbol.split("::").all(is_ident) {
        let segments: Vec<&str> = symbol.split("::").collect();
        if FOREIGN_CRATES.contains(&segments[0]) {
            return None;
        }
        let missing: Vec<&&str> = segments
            .iter()
            .filter(|s| {
                !([
                    "crate",
                    "self",
                    "super",
                    "seckill",
                    "redis_locks",
                    "seckill_lab",
                    "testkit",
                    "loadtest",
                ]
                .contains(s)
                    || code.items.contains(**s))
            })
            .collect();
        return (!missing.is_empty()).then(|| format!("symbol {span} ({missing:?} not defined)"));
    }
    // A variable: `SECKILL_SALE_BATCH_MAX` or `SECKILL_LAB=1`.
    let variable = span.split('=').next().unwrap_or(span);
    let upper = |s: &str| {
        s.contains('_')
            && s.chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            && s.starts_with(|c: char| c.is_ascii_uppercase())
    };
    if upper(variable) {
        return (!code.words.contains(variable)).then(|| format!("variable {variable}"));
    }
    // A field, key or function: snake_case with an underscore.
    let name = span.trim_end_matches("()");
    let snake = name.contains('_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && name.starts_with(|c: char| c.is_ascii_lowercase());
    if snake {
        return (!code.words.contains(name)).then(|| format!("name {span}"));
    }
    None
}

/// A heading's anchor as mdBook and GitHub make it.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(markdown: &str) -> HashSet<String> {
    markdown
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| slug(l.trim_start_matches('#')))
        .collect()
}

/// Texts with the line they stand on.
type Located = Vec<(usize, String)>;

/// The inline code spans and relative links of a Markdown text, outside
/// fenced code blocks, with their line numbers.
fn spans_and_links(markdown: &str) -> (Located, Located) {
    let (mut spans, mut links) = (Vec::new(), Vec::new());
    let mut fenced = false;
    for (i, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || line.trim_start().starts_with("{{#") {
            continue;
        }
        let mut parts = line.split('`');
        let mut outside = vec![parts.next().unwrap_or("").to_owned()];
        while let (Some(inside), after) = (parts.next(), parts.next()) {
            spans.push((i + 1, inside.to_owned()));
            outside.push(after.unwrap_or("").to_owned());
        }
        let prose = outside.join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            if !target.contains("://") && !target.starts_with("mailto:") && !target.is_empty() {
                links.push((i + 1, target.to_owned()));
            }
            rest = &after[end..];
        }
    }
    (spans, links)
}

fn check_doc(doc: &Path, markdown: &str, root: &Path, code: &Code) -> Vec<Stale> {
    let dir = doc.parent().unwrap_or(root);
    let name = doc.strip_prefix(root).unwrap_or(doc).display().to_string();
    let stale = |line: usize, what: String| Stale {
        doc: name.clone(),
        line,
        what,
    };
    let (spans, links) = spans_and_links(markdown);
    let mut found: Vec<Stale> = spans
        .iter()
        .filter_map(|(line, span)| check_span(span, dir, root, code).map(|w| stale(*line, w)))
        .collect();
    for (line, target) in links {
        let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
        let path = if file.is_empty() {
            doc.to_path_buf()
        } else {
            dir.join(file)
        };
        if !path.exists() {
            found.push(stale(line, format!("link {target}")));
            continue;
        }
        let is_md = path.extension().is_some_and(|e| e == "md");
        if !anchor.is_empty() && is_md {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if !anchors(&text).contains(anchor) {
                found.push(stale(line, format!("anchor {target}")));
            }
        }
    }
    found
}

/// Every Markdown file the check reads.
fn docs(root: &Path) -> Vec<PathBuf> {
    let mut docs = vec![
        root.join("README.md"),
        root.join("ARCHITECTURE.md"),
        root.join("LAB.md"),
        root.join("redis-locks/README.md"),
    ];
    let mut guide = Vec::new();
    files_under(&root.join("docs/guide/src"), &mut guide);
    guide.retain(|p| p.extension().is_some_and(|e| e == "md"));
    guide.sort();
    docs.extend(guide);
    docs.retain(|p| p.exists());
    docs
}

/// The service's modules and what ARCHITECTURE.md lets each import: the
/// rows of its table under the `imports` marker (`nothing` for none).
fn allowed_imports(page: &str) -> BTreeMap<String, HashSet<String>> {
    let ticked = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    };
    page.lines()
        .skip_while(|line| !line.contains("<!-- imports:"))
        .skip(1)
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .filter_map(|row| {
            let cells: Vec<&str> = row.trim_matches('|').split('|').collect();
            let module = ticked(cells.first()?).into_iter().next()?;
            Some((module, ticked(cells.last()?).into_iter().collect()))
        })
        .collect()
}

/// The names that follow `prefix` in `code`, comments left out: `name` of
/// `prefix name`, and each top-level name of a group `prefix{a, b::C}`,
/// also across lines (as rustfmt wraps a long `use`).
fn names_after(code: &str, prefix: &str) -> Vec<String> {
    let code: Vec<&str> = code
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect();
    let code = code.join("\n");
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        let rest = &code[at + prefix.len()..];
        let Some(group) = rest.strip_prefix('{') else {
            names.push(ident(rest));
            continue;
        };
        let (mut depth, mut item_starts) = (0, true);
        for (i, c) in group.char_indices() {
            if item_starts && depth == 0 {
                names.push(ident(&group[i..]));
                item_starts = false;
            }
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => item_starts = true,
                _ => {}
            }
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

/// The modules of the crate that `code` (one module's files) names as
/// `crate::<module>`.
fn crate_imports(code: &str) -> HashSet<String> {
    names_after(code, "crate::").into_iter().collect()
}

#[test]
fn every_module_imports_only_what_the_architecture_allows() {
    let root = root();
    let page = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let allowed = allowed_imports(&page);
    assert!(
        allowed.len() >= 10 && allowed["http"].contains("seckill"),
        "ARCHITECTURE.md's imports table was read: {allowed:?}"
    );
    let mut wrong = Vec::new();
    for entry in std::fs::read_dir(root.join("src")).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let module = name.trim_end_matches(".rs").to_owned();
        if ["main", "lib"].contains(&module.as_str()) {
            continue;
        }
        let Some(may) = allowed.get(&module) else {
            wrong.push(format!("module {module} has no row in ARCHITECTURE.md"));
            continue;
        };
        let mut files = Vec::new();
        if path.is_dir() {
            files_under(&path, &mut files);
        } else {
            files.push(path);
        }
        for file in files
            .iter()
            .filter(|f| f.extension().is_some_and(|e| e == "rs"))
        {
            let code = std::fs::read_to_string(file).unwrap();
            for import in crate_imports(&code) {
                if import != module && !may.contains(&import) {
                    wrong.push(format!(
                        "{} imports crate::{import}, which ARCHITECTURE.md does not let {module} import",
                        file.strip_prefix(&root).unwrap_or(file).display()
                    ));
                }
            }
        }
    }
    for module in allowed.keys() {
        let exists = root.join("src").join(module).is_dir()
            || root.join("src").join(format!("{module}.rs")).is_file();
        if !exists {
            wrong.push(format!(
                "ARCHITECTURE.md lists a module {module} that src/ lacks"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The files of `src/http` each file imports, outside its tests: `super::x`
/// (or `super::{x, ...}`) of a sibling file `x`, and of `mod` for anything
/// else `super::` names (what `mod.rs` defines); `mod.rs` imports the files
/// whose paths it uses.
fn http_imports(root: &Path) -> BTreeMap<String, HashSet<String>> {
    let dir = root.join("src/http");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    let stem = |p: &Path| p.file_stem().unwrap().to_string_lossy().into_owned();
    let siblings: HashSet<String> = files.iter().map(|p| stem(p)).collect();
    let mut graph = BTreeMap::new();
    for file in &files {
        let me = stem(file);
        let text = std::fs::read_to_string(file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let mut uses = HashSet::new();
        if me == "mod" {
            for line in code.lines() {
                let line = line.split("//").next().unwrap_or("");
                for sibling in &siblings {
                    let named = line.contains(&format!("{sibling}::"))
                        && !line.contains(&format!("crate::{sibling}::"));
                    if sibling != "mod" && named && !line.trim_start().starts_with("mod ") {
                        uses.insert(sibling.clone());
                    }
                }
            }
        } else {
            for name in names_after(code, "super::") {
                uses.insert(if siblings.contains(&name) {
                    name
                } else {
                    "mod".to_owned()
                });
            }
        }
        uses.remove(&me);
        graph.insert(me, uses);
    }
    graph
}

/// A cycle in `graph`, if it has one, as the files around it.
fn a_cycle(graph: &BTreeMap<String, HashSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, HashSet<String>>,
        path: &mut Vec<String>,
        done: &mut HashSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        let mut next: Vec<&String> = graph.get(node).into_iter().flatten().collect();
        next.sort();
        for n in next {
            if let Some(cycle) = visit(n, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = HashSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_files_of_src_http_import_each_other_without_a_cycle() {
    let graph = http_imports(&root());
    assert!(
        graph["routes"].contains("handlers") && graph["handlers"].contains("state"),
        "the import reader found the router's and the handlers' imports: {graph:?}"
    );
    if let Some(cycle) = a_cycle(&graph) {
        panic!("src/http imports in a cycle: {}", cycle.join(" -> "));
    }
    let looped = BTreeMap::from([
        ("a".to_owned(), HashSet::from(["b".to_owned()])),
        ("b".to_owned(), HashSet::from(["a".to_owned()])),
    ]);
    assert_eq!(
        a_cycle(&looped).map(|c| c.len()),
        Some(3),
        "the cycle finder finds one"
    );
}

#[test]
fn the_import_check_reads_the_table_and_the_code_as_written() {
    let page = "<!-- imports: -->\n\n| module | owns | may import |\n|---|---|---|\n\
                | `http` | routes (`a::b`) | `seckill`, `domain` |\n| `domain` | words | nothing |\n\nprose";
    let allowed = allowed_imports(page);
    assert_eq!(allowed.len(), 2);
    assert_eq!(
        allowed["http"],
        HashSet::from(["seckill".to_owned(), "domain".to_owned()])
    );
    assert!(allowed["domain"].is_empty());
    let code = "use crate::store::Store;\n// crate::http in a comment\nlet x = crate::id::draw();";
    assert_eq!(
        crate_imports(code),
        HashSet::from(["store".to_owned(), "id".to_owned()])
    );
    let grouped = "use crate::{\n    auth::Authenticator,\n    kv::{Keys, Kv}, // crate::http\n    store,\n};";
    assert_eq!(
        crate_imports(grouped),
        HashSet::from(["auth".to_owned(), "kv".to_owned(), "store".to_owned()])
    );
}

#[test]
fn every_name_and_link_in_the_docs_exists_in_the_code() {
    let root = root();
    let code = Code::read(&root);
    assert!(
        code.routes.contains("POST /seckill/{}"),
        "the route reader found the purchase route"
    );
    let mut stale = Vec::new();
    for doc in docs(&root) {
        let text = std::fs::read_to_string(&doc).unwrap();
        stale.extend(check_doc(&doc, &text, &root, &code));
    }
    let report: Vec<String> = stale
        .iter()
        .map(|s| format!("{}:{}: {}", s.doc, s.line, s.what))
        .collect();
    assert!(
        report.is_empty(),
        "the docs name what the code lacks:\n{}",
        report.join("\n")
    );
}

#[test]
fn a_renamed_path_symbol_route_field_or_variable_is_caught() {
    let root = root();
    let code = Code::read(&root);
    let doc = root.join("README.md");
    let good = "The sale is `POST /seckill/{voucher_id}` in `src/http/mod.rs`, \
                `store::Store` and `Seckill::purchase`, `pay_within_seconds`, \
                `SECKILL_ADMIN_TOKEN`, see [the lab](LAB.md).";
    assert_eq!(check_doc(&doc, good, &root, &code), Vec::new());
    let renamed = [
        ("`POST /seckill/{voucher_id}/now`", "route"),
        ("`/orders/{order_id}/refund`", "route"),
        ("`src/http/gone.rs`", "path"),
        ("`store::SELL_ONE`", "symbol"),
        ("`Seckill::purchase_twice()`", "symbol"),
        ("`pay_within_minutes`", "name"),
        ("`SECKILL_NO_SUCH_SETTING=1`", "variable"),
        ("[gone](docs/nothing.md)", "link"),
        ("[gone](LAB.md#no-such-heading)", "anchor"),
    ];
    for (text, kind) in renamed {
        let found = check_doc(&doc, text, &root, &code);
        assert!(
            found.len() == 1 && found[0].what.starts_with(kind),
            "{text}: {found:?}"
        );
    }
    // Code blocks are not read.
    let fenced = "```sh\ncat src/http/gone.rs\n```\n";
    assert_eq!(check_doc(&doc, fenced, &root, &code), Vec::new());
}

/// The page's DOM after its scripts ran, in headless Chromium with every
/// host unresolvable: what a reader sees with no network at all.
fn rendered_offline(page: &Path) -> String {
    let profile = std::env::temp_dir().join(format!(
        "seckill-guide-chromium-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let output = testkit::headless_chromium(&profile)
        .args([
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--virtual-time-budget=20000",
        ])
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium runs");
    let _ = std::fs::remove_dir_all(&profile);
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn the_guide_builds_and_draws_every_diagram_offline_needs_chromium() {
    let root = root();
    // mdBook and mermaid come from their registries the first time.
    let built = std::process::Command::new("bash")
        .arg(root.join("scripts/guide.sh"))
        .current_dir(&root)
        .status()
        .expect("bash runs scripts/guide.sh");
    assert!(
        built.success(),
        "scripts/guide.sh failed (its output is above)"
    );
    let mut chapters = Vec::new();
    files_under(&root.join("docs/guide/src"), &mut chapters);
    let mut drawn = 0;
    for chapter in chapters {
        let Ok(text) = std::fs::read_to_string(&chapter) else {
            continue;
        };
        let diagrams = text.matches("```mermaid").count();
        if diagrams == 0 {
            continue;
        }
        let relative = chapter
            .strip_prefix(root.join("docs/guide/src"))
            .unwrap()
            .with_extension("html");
        let page = root.join("target/guide").join(&relative);
        assert!(page.exists(), "{} was not built", page.display());
        let dom = rendered_offline(&page);
        // mermaid marks each drawing with its kind (flowchart-v2, sequence, ...).
        let svgs = dom.matches("aria-roledescription=").count();
        assert!(
            svgs >= diagrams && !dom.contains("Syntax error"),
            "{}: {diagrams} diagrams, {svgs} drawn:\n{}",
            relative.display(),
            &dom[..dom.len().min(3_000)]
        );
        drawn += diagrams;
    }
    assert!(drawn > 0, "the guide has no diagram to draw");
}
