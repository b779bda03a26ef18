//! The docs against the code: every relative link resolves, and every path,
//! route, symbol, field or variable that the prose names in `inline code`
//! still exists. Reads the README, the guide (`docs/guide/src`), LAB.md and
//! the lock library's README; a rename in the code fails this test until
//! the docs follow. A default, a timeout or a limit quoted next to its
//! setting's name must be the code's value, read from the flags'
//! definitions (`Settings`, the lab's `LabArgs`) and the constants.

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
        graph["routes"].contains("sale") && graph["sale"].contains("state"),
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

// ---------------------------------------------------------------------------
// The settings the prose quotes: a default, a timeout or a limit written
// next to its name must be the code's.

/// A value as the code holds it and as prose may write it.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    /// A duration, in milliseconds.
    Millis(u64),
    /// A count: requests per second, units, orders, bytes.
    Count(u64),
    /// A default that is a word or an address (`on`, `none`, a URL).
    Text(String),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Millis(ms) if ms % 1000 == 0 => write!(f, "{} s", ms / 1000),
            Value::Millis(ms) => write!(f, "{ms} ms"),
            Value::Count(n) => write!(f, "{n}"),
            Value::Text(t) => write!(f, "{t:?}"),
        }
    }
}

/// A setting of the code that the prose may quote by `name`.
#[derive(Debug, Clone)]
struct Setting {
    name: String,
    /// The code's value.
    value: Value,
    /// What a number written without a unit means, in milliseconds, for a
    /// duration (`SECKILL_LOCK_LEASE_MS` (10000), `pay_within_seconds`
    /// (900)); `None` for a constant whose unit the prose must write.
    bare_ms: Option<u64>,
}

fn millis(duration: std::time::Duration) -> Value {
    Value::Millis(u64::try_from(duration.as_millis()).unwrap())
}

/// What a number without a unit means for a variable, from its name.
fn bare_unit_of(variable: &str) -> Option<u64> {
    [
        ("_MS", 1),
        ("_SECS", 1_000),
        ("_SECONDS", 1_000),
        ("_DAYS", 86_400_000),
    ]
    .iter()
    .find(|(suffix, _)| variable.ends_with(suffix))
    .map(|(_, ms)| *ms)
}

/// Every setting the prose may quote, read from the code: each variable of
/// the service's and the lab's flags with its clap default, and the public
/// constants the guide names.
fn code_settings(root: &Path) -> Vec<Setting> {
    use clap::Args;
    let command = seckill_lab::LabArgs::augment_args(seckill::config::Settings::augment_args(
        clap::Command::new("settings"),
    ));
    let mut settings = Vec::new();
    for arg in command.get_arguments() {
        let (Some(env), [default]) = (arg.get_env(), arg.get_default_values()) else {
            continue;
        };
        let name = env.to_string_lossy().into_owned();
        let text = default.to_string_lossy().into_owned();
        let bare_ms = bare_unit_of(&name);
        let value = match (text.parse::<u64>(), bare_ms) {
            (Ok(n), Some(unit)) => Value::Millis(n * unit),
            (Ok(n), None) => Value::Count(n),
            // A switch: `SECKILL_LAB` is off unless set.
            _ if text == "false" => Value::Text("off".to_owned()),
            _ => Value::Text(text),
        };
        settings.push(Setting {
            name,
            value,
            bare_ms,
        });
    }
    let mut constant = |name: &str, value: Value, bare_ms: Option<u64>| {
        settings.push(Setting {
            name: name.to_owned(),
            value,
            bare_ms,
        })
    };
    constant(
        "STOCK_REFRESH",
        millis(seckill::seckill::STOCK_REFRESH),
        None,
    );
    constant("LIST_REFRESH", millis(seckill::seckill::LIST_REFRESH), None);
    constant("READY_EVERY", millis(seckill::seckill::READY_EVERY), None);
    constant(
        "ADMISSION_WINDOW",
        millis(seckill::seckill::ADMISSION_WINDOW),
        None,
    );
    let count = |n: i64| Value::Count(u64::try_from(n).unwrap());
    constant(
        "LISTED_VOUCHERS",
        count(seckill::seckill::LISTED_VOUCHERS),
        Some(1),
    );
    constant(
        "LOCKS_PER_CALL",
        Value::Count(redis_locks::LOCKS_PER_CALL as u64),
        Some(1),
    );
    // A voucher's defaults, quoted by the fields that take them.
    constant(
        "pay_within_seconds",
        Value::Millis(1_000 * u64::try_from(seckill::seckill::DEFAULT_PAY_WITHIN_SECONDS).unwrap()),
        Some(1_000),
    );
    constant(
        "max_orders_per_user",
        count(seckill::seckill::DEFAULT_MAX_ORDERS_PER_USER),
        Some(1),
    );
    constant(
        "max_units_per_user",
        count(seckill::seckill::DEFAULT_MAX_UNITS_PER_USER),
        Some(1),
    );
    // Every other constant, read from the source's text.
    for found in source_constants(root) {
        if !settings.iter().any(|s| s.name == found.name) {
            settings.push(found);
        }
    }
    settings
}

/// Integer constants that count seconds without saying so in their name.
const SECONDS_CONSTANTS: &[&str] = &["MAX_POLL_EVERY", "SOLD_OUT_POLL_EVERY"];

/// The constants of the service's, the lab's and the lock library's
/// source, read as text: `const NAME: Duration = Duration::from_millis(N)`
/// (or `from_secs`) and integer constants written as a literal, a product
/// of literals or a shift. A name defined twice with different values is
/// left out: the prose could not say which it means.
fn source_constants(root: &Path) -> Vec<Setting> {
    let mut files = Vec::new();
    for dir in ["src", "lab/src", "redis-locks/src"] {
        files_under(&root.join(dir), &mut files);
    }
    files.retain(|f| f.extension().is_some_and(|e| e == "rs"));
    files.sort();
    let mut found: BTreeMap<String, Option<Setting>> = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for line in text.lines() {
            let line = line.trim_start();
            let line = ["pub(crate) ", "pub(super) ", "pub "]
                .iter()
                .find_map(|p| line.strip_prefix(p))
                .unwrap_or(line);
            let Some(rest) = line.strip_prefix("const ") else {
                continue;
            };
            let Some((name, rest)) = rest.split_once(": ") else {
                continue;
            };
            let Some((ty, expr)) = rest.split_once(" = ") else {
                continue;
            };
            let expr = expr.trim_end_matches(';');
            // A literal, a product of literals (`2 * 1024 * 1024`) or a
            // shift (`1 << 20`).
            let number = |text: &str| -> Option<u64> {
                let literal = |t: &str| t.trim().replace('_', "").parse::<u64>().ok();
                if let Some((a, b)) = text.split_once("<<") {
                    return literal(a)?.checked_shl(u32::try_from(literal(b)?).ok()?);
                }
                text.split('*')
                    .try_fold(1u64, |product, t| product.checked_mul(literal(t)?))
            };
            let setting = if ty == "Duration" {
                let (digits, unit) = if let Some(d) = expr.strip_prefix("Duration::from_millis(") {
                    (d, 1)
                } else if let Some(d) = expr.strip_prefix("Duration::from_secs(") {
                    (d, 1_000)
                } else {
                    continue;
                };
                let Some(n) = digits.strip_suffix(')').and_then(number) else {
                    continue;
                };
                Setting {
                    name: name.to_owned(),
                    value: Value::Millis(n * unit),
                    bare_ms: None,
                }
            } else if ["u8", "u16", "u32", "u64", "usize", "i16", "i32", "i64"].contains(&ty) {
                let Some(n) = number(expr) else { continue };
                let unit = if SECONDS_CONSTANTS.contains(&name) {
                    Some(1_000)
                } else {
                    bare_unit_of(name)
                };
                Setting {
                    name: name.to_owned(),
                    value: unit.map_or(Value::Count(n), |ms| Value::Millis(n * ms)),
                    bare_ms: unit.or(Some(1)),
                }
            } else {
                continue;
            };
            match found.get(name) {
                None => {
                    found.insert(name.to_owned(), Some(setting));
                }
                Some(Some(earlier)) if earlier.value != setting.value => {
                    found.insert(name.to_owned(), None);
                }
                Some(_) => {}
            }
        }
    }
    found.into_values().flatten().collect()
}

/// A value as prose writes it (`2 s`, `500 ms`, `default **200
/// requests/s**`, `900 s by default`, `a day`), for `setting`; `None` when
/// `text` is not just a value.
fn prose_value(text: &str, setting: &Setting) -> Option<Value> {
    let cleaned = text.replace(['*', '`'], "").to_lowercase();
    let mut words: Vec<&str> = cleaned.split_whitespace().collect();
    // "default 5", "default of 5", "5 by default".
    if words.first() == Some(&"default") {
        words.remove(0);
        if words.first() == Some(&"of") {
            words.remove(0);
        }
    }
    if words.ends_with(&["by", "default"]) {
        words.truncate(words.len() - 2);
    }
    let phrase = words.join(" ");
    let named = [
        ("a second", 1_000),
        ("one second", 1_000),
        ("a minute", 60_000),
        ("an hour", 3_600_000),
        ("a day", 86_400_000),
        ("one day", 86_400_000),
    ];
    if let Some((_, ms)) = named.iter().find(|(p, _)| *p == phrase) {
        return Some(Value::Millis(*ms));
    }
    let (number, unit) = match words.as_slice() {
        [number] => (*number, ""),
        [number, ..] => (*number, &phrase[number.len() + 1..]),
        [] => return None,
    };
    // "5/s": the number and its unit written together.
    let (number, unit) = match number.split_once('/') {
        Some((n, _)) if unit.is_empty() => (n, "per second"),
        _ => (number, unit),
    };
    if !number.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let n: f64 = number.replace(',', "").parse().ok()?;
    let ms = |factor: f64| Some(Value::Millis((n * factor).round() as u64));
    match unit {
        "" => match (&setting.value, setting.bare_ms) {
            (Value::Millis(_), Some(unit)) => ms(unit as f64),
            (Value::Millis(_), None) => None,
            _ => Some(Value::Count(n as u64)),
        },
        "ms" | "milliseconds" => ms(1.0),
        "s" | "second" | "seconds" => ms(1_000.0),
        "min" | "minute" | "minutes" => ms(60_000.0),
        "h" | "hour" | "hours" => ms(3_600_000.0),
        "day" | "days" => ms(86_400_000.0),
        "per second"
        | "requests/s"
        | "requests per second"
        | "requests a second"
        | "a second"
        | "units"
        | "orders"
        | "locks"
        | "vouchers"
        | "bytes"
        | "characters" => Some(Value::Count(n as u64)),
        "kib" => Some(Value::Count((n * 1024.0) as u64)),
        "mib" => Some(Value::Count((n * 1024.0 * 1024.0) as u64)),
        _ => None,
    }
}

/// One place where a page quotes a setting's value.
#[derive(Debug)]
struct Quote {
    page: String,
    line: usize,
    setting: String,
    prose: Value,
    code: Value,
}

/// `markdown` with its fenced blocks blanked (their newlines kept, so that
/// offsets still give lines): diagrams and commands are not prose.
fn prose_only(markdown: &str) -> String {
    let mut out = String::with_capacity(markdown.len());
    let mut fenced = false;
    for line in markdown.split_inclusive('\n') {
        let fence = line.trim_start().starts_with("```");
        if fence {
            fenced = !fenced;
        }
        if fence || fenced || line.trim_start().starts_with("{{#") {
            out.extend(line.chars().map(|c| if c == '\n' { '\n' } else { ' ' }));
        } else {
            out.push_str(line);
        }
    }
    out
}

/// The value quoted right after a name: "`X` (2 s)", "(`X`, 256)",
/// "`X`, default **200 requests/s**, burst 200", "`X` (orders in any
/// status, 3 by default)". The clause runs to the first `)`, `;` or `|`;
/// of its comma-separated parts, one that says "default" wins, else the
/// first, which must be a value and nothing else.
fn quoted_after(after: &str, setting: &Setting) -> Option<Value> {
    let rest = after.trim_start();
    let clause = rest.strip_prefix('(').or_else(|| rest.strip_prefix(','))?;
    let end = clause.find([')', ';', '|', '(']).unwrap_or(clause.len());
    let clause = clause[..end].split(". ").next().unwrap_or("");
    let parts: Vec<&str> = clause.split(',').collect();
    parts
        .iter()
        .filter(|p| p.contains("default"))
        .find_map(|p| prose_value(p, setting))
        .or_else(|| prose_value(parts.first()?, setting))
}

/// The value quoted right before a name that opens parentheses: "every
/// 500 ms per instance (`READY_EVERY`)": a value with its unit among the
/// few words before, with no punctuation between.
fn quoted_before(before: &str, setting: &Setting) -> Option<Value> {
    let before = before.strip_suffix('(')?;
    let start = before
        .rfind(['.', ',', ';', ':', '(', ')', '|', '`'])
        .map_or(0, |at| at + 1);
    let words: Vec<&str> = before[start..].split_whitespace().collect();
    let words = &words[words.len().saturating_sub(8)..];
    // The value nearest the name, with a unit (a bare number is not read).
    (0..words.len()).rev().find_map(|i| {
        (2..=3)
            .filter(|k| i + k <= words.len())
            .find_map(|k| prose_value(&words[i..i + k].join(" "), setting))
    })
}

/// Every quote of a setting on one page: after or before its name in
/// backticks in the prose, and, on the configuration page, each row of the
/// settings table (`| \`NAME\` | meaning | default |`).
fn quotes_in(page: &str, markdown: &str, settings: &[Setting]) -> (Vec<Quote>, Vec<String>) {
    let text = prose_only(markdown);
    let line_of = |at: usize| text[..at].matches('\n').count() + 1;
    let (mut quotes, mut unreadable) = (Vec::new(), Vec::new());
    for setting in settings {
        let span = format!("`{}`", setting.name);
        for (at, _) in text.match_indices(&span) {
            let before = &text[..at];
            let after = text[at + span.len()..].replace('\n', " ");
            // A row of the settings table: its last cell is the default.
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            if page.ends_with("configuration.md") && &before[line_start..] == "| " {
                let row = text[at + span.len()..].lines().next().unwrap_or("");
                let cells: Vec<&str> = row.trim().trim_end_matches('|').split('|').collect();
                let cell = cells.last().unwrap_or(&"").trim();
                let prose = match &setting.value {
                    Value::Text(t) if t.is_empty() => {
                        (cell == "empty").then(|| Value::Text(t.clone()))
                    }
                    Value::Text(t) => (cell == t || cell.starts_with(&format!("`{t}`")))
                        .then(|| Value::Text(t.clone()))
                        .or_else(|| Some(Value::Text(cell.to_owned()))),
                    _ => prose_value(cell, setting),
                };
                match prose {
                    Some(prose) => quotes.push(Quote {
                        page: page.to_owned(),
                        line: line_of(at),
                        setting: setting.name.clone(),
                        prose,
                        code: setting.value.clone(),
                    }),
                    None => unreadable.push(format!(
                        "{page}:{}: the table's default of {} ({cell:?}) is not a value; the code's is {}",
                        line_of(at),
                        setting.name,
                        setting.value
                    )),
                }
                continue;
            }
            // A function of the setting ("min(`X`, 500 ms)") quotes
            // something else.
            let called = before.ends_with('(')
                && before[..before.len() - 1].ends_with(|c: char| c.is_ascii_alphanumeric());
            let prose = if called {
                None
            } else {
                quoted_after(&after, setting)
                    .or_else(|| quoted_before(&before.replace('\n', " "), setting))
            };
            if let Some(prose) = prose {
                quotes.push(Quote {
                    page: page.to_owned(),
                    line: line_of(at),
                    setting: setting.name.clone(),
                    prose,
                    code: setting.value.clone(),
                });
            }
        }
    }
    (quotes, unreadable)
}

#[test]
fn every_setting_the_docs_quote_has_the_codes_value() {
    let root = root();
    let settings = code_settings(&root);
    assert!(
        settings.len() >= 30
            && settings
                .iter()
                .any(|s| s.name == "SECKILL_DEPENDENCY_TIMEOUT_MS"
                    && s.value == Value::Millis(2_000)),
        "the settings were read from the code: {settings:?}"
    );
    let (mut quotes, mut problems) = (Vec::new(), Vec::new());
    for doc in docs(&root) {
        let page = doc.strip_prefix(&root).unwrap().display().to_string();
        let text = std::fs::read_to_string(&doc).unwrap();
        let (found, unreadable) = quotes_in(&page, &text, &settings);
        quotes.extend(found);
        problems.extend(unreadable);
    }
    for quote in &quotes {
        if quote.prose != quote.code {
            problems.push(format!(
                "{}:{}: the prose quotes {} as {}, the code's value is {}",
                quote.page, quote.line, quote.setting, quote.prose, quote.code
            ));
        }
    }
    if std::env::var_os("SECKILL_DOCS_LIST_QUOTES").is_some() {
        for q in &quotes {
            eprintln!("{}:{}: {} = {}", q.page, q.line, q.setting, q.prose);
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Not vacuous (82 quotes on 21 pages when this was written): the
    // configuration table quotes the default of every variable that has
    // one (but the hidden fault injection), and the chapters quote the
    // timeouts, the limits and the constants.
    let in_table: HashSet<&str> = quotes
        .iter()
        .filter(|q| q.page.ends_with("configuration.md"))
        .map(|q| q.setting.as_str())
        .collect();
    use clap::Args;
    let command = seckill_lab::LabArgs::augment_args(seckill::config::Settings::augment_args(
        clap::Command::new("settings"),
    ));
    let untabled: Vec<String> = command
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !a.get_default_values().is_empty())
        .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
        .filter(|name| !in_table.contains(name.as_str()))
        .collect();
    assert!(
        untabled.is_empty(),
        "configuration.md's table gives no default for {untabled:?}"
    );
    let table = in_table.len();
    let pages: HashSet<&str> = quotes.iter().map(|q| q.page.as_str()).collect();
    assert!(
        quotes.len() >= 75 && table >= 25 && pages.len() >= 20,
        "only {} quotes of settings found ({table} in the configuration table, on {} pages)",
        quotes.len(),
        pages.len()
    );
}

#[test]
fn a_quoted_setting_that_differs_from_the_code_is_caught() {
    let settings = vec![
        Setting {
            name: "SECKILL_LOCK_LEASE_MS".to_owned(),
            value: Value::Millis(10_000),
            bare_ms: Some(1),
        },
        Setting {
            name: "READY_EVERY".to_owned(),
            value: Value::Millis(500),
            bare_ms: None,
        },
        Setting {
            name: "SECKILL_LIMIT_PER_USER".to_owned(),
            value: Value::Count(5),
            bare_ms: None,
        },
        Setting {
            name: "MAX_BODY_BYTES".to_owned(),
            value: Value::Count(2 * 1024 * 1024),
            bare_ms: Some(1),
        },
    ];
    let read = |text: &str| -> Vec<(String, Value)> {
        quotes_in("docs/guide/src/x.md", text, &settings)
            .0
            .into_iter()
            .map(|q| (q.setting, q.prose))
            .collect()
    };
    let lease = |ms| vec![("SECKILL_LOCK_LEASE_MS".to_owned(), Value::Millis(ms))];
    assert_eq!(
        read("after `SECKILL_LOCK_LEASE_MS` (10 s) it lapses"),
        lease(10_000)
    );
    assert_eq!(
        read("the lease (`SECKILL_LOCK_LEASE_MS`, 5 s) ends"),
        lease(5_000)
    );
    assert_eq!(
        read("`SECKILL_LOCK_LEASE_MS` (default\n10000)"),
        lease(10_000)
    );
    assert_eq!(
        read("`SECKILL_LOCK_LEASE_MS` (a fixed lease, 9 s by default)"),
        lease(9_000)
    );
    assert_eq!(
        read("every 400 ms per instance (`READY_EVERY`)"),
        vec![("READY_EVERY".to_owned(), Value::Millis(400))]
    );
    assert_eq!(
        read("(`SECKILL_LIMIT_PER_USER`,\ndefault **6/s**, burst 6)"),
        vec![("SECKILL_LIMIT_PER_USER".to_owned(), Value::Count(6))]
    );
    assert_eq!(
        read("| 413 | a body over 3 MiB (`MAX_BODY_BYTES`), on any route |"),
        vec![("MAX_BODY_BYTES".to_owned(), Value::Count(3 * 1024 * 1024))]
    );
    // Not quotes of the value: a function of it, a value set, prose after
    // it, code blocks.
    for text in [
        "min(`SECKILL_LOCK_LEASE_MS`, 500 ms)",
        "`SECKILL_LOCK_LEASE_MS=500` shortens it",
        "`SECKILL_LOCK_LEASE_MS` and a quarter (tested at 1 s)",
        "`SECKILL_LOCK_LEASE_MS` (1 to 60 s)",
        "```sh\n`SECKILL_LOCK_LEASE_MS` (3 s)\n```\n",
        "`READY_EVERY` (500)",
    ] {
        assert_eq!(read(text), Vec::new(), "{text}");
    }
    // The settings table: the last cell of a row.
    let table = "| `SECKILL_LOCK_LEASE_MS` | lease | 2000 |\n";
    let (quotes, _) = quotes_in("docs/guide/src/configuration.md", table, &settings);
    assert_eq!(quotes.len(), 1);
    assert_eq!(quotes[0].prose, Value::Millis(2_000));
}

// ---------------------------------------------------------------------------
// The exercises' answers: each `<details>` block of exercises.md names what
// it is checked against (`<!-- check: grid <strategy> | <column> -->`, a
// cell of the recorded lab grid; `<!-- check: error <code> -->`, the
// service's answer for that error), and must say what that source says.

/// The recorded lab grid's cells: (strategy, column) -> the cell without
/// its bold.
fn lab_grid(markdown: &str) -> BTreeMap<(String, String), String> {
    let cells = |line: &str| -> Vec<String> {
        line.trim()
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().replace("**", ""))
            .collect()
    };
    let mut lines = markdown
        .lines()
        .skip_while(|l| !l.starts_with("| strategy"));
    let header = cells(lines.next().unwrap_or(""));
    let mut grid = BTreeMap::new();
    for row in lines.skip(1).take_while(|l| l.starts_with('|')) {
        let row = cells(row);
        let strategy = row[0].trim_matches('`').to_owned();
        for (column, cell) in header.iter().zip(&row).skip(1) {
            grid.insert((strategy.clone(), column.clone()), cell.clone());
        }
    }
    grid
}

/// The status and error code the service answers for the error `code`.
fn answer_for(code: &str) -> Option<(u16, String)> {
    use axum::response::IntoResponse;
    use seckill::http::ApiError;
    use seckill::seckill::Refusal;
    let error = match code {
        "purchase_in_progress" => ApiError::Refused(Refusal::InProgress),
        "sold_out" => ApiError::Refused(Refusal::SoldOut),
        "already_purchased" => ApiError::Refused(Refusal::AlreadyPurchased { order_id: None }),
        _ => return None,
    };
    let response = error.into_response();
    let status = response.status().as_u16();
    let body = futures::executor::block_on(axum::body::to_bytes(response.into_body(), 1 << 16))
        .expect("an error body");
    let body: serde_json::Value = serde_json::from_slice(&body).expect("a JSON error body");
    Some((status, body["error"].as_str()?.to_owned()))
}

/// Why the answers of an exercises page disagree with their sources.
fn wrong_answers(page: &str, grid: &BTreeMap<(String, String), String>) -> Answers {
    let mut wrong = Vec::new();
    let blocks: Vec<&str> = page
        .split("<details>")
        .skip(1)
        .map(|b| b.split("</details>").next().unwrap_or(""))
        .collect();
    let mut checked = 0;
    for (i, block) in blocks.iter().enumerate() {
        let n = i + 1;
        let checks: Vec<&str> = block
            .match_indices("<!-- check:")
            .map(|(at, _)| {
                let rest = &block[at + "<!-- check:".len()..];
                rest[..rest.find("-->").unwrap_or(rest.len())].trim()
            })
            .collect();
        if checks.is_empty() {
            wrong.push(format!("answer {n} names no source to check it against"));
        }
        // The answer as the reader sees it, without the check comments.
        let said = block
            .split("<!--")
            .enumerate()
            .map(|(j, part)| {
                if j == 0 {
                    part
                } else {
                    part.split_once("-->").map_or("", |p| p.1)
                }
            })
            .collect::<String>()
            // Its words as they read, whatever line they wrap onto.
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        for check in checks {
            if let Some(cell) = check.strip_prefix("grid ") {
                let (strategy, column) = cell.split_once(" | ").unwrap_or((cell, ""));
                let (strategy, column) = (strategy.trim(), column.trim());
                match grid.get(&(strategy.to_owned(), column.to_owned())) {
                    None => wrong.push(format!(
                        "answer {n}: the grid has no cell {strategy} | {column}"
                    )),
                    Some(cell) if cell == "·" => wrong.push(format!(
                        "answer {n}: {strategy} does not run {column}"
                    )),
                    Some(cell) if !(said.contains(cell.as_str()) && said.contains(strategy)) => {
                        wrong.push(format!(
                            "answer {n}: the grid's {strategy} | {column} reads {cell:?}, which the answer does not say"
                        ))
                    }
                    Some(_) => checked += 1,
                }
            } else if let Some(code) = check.strip_prefix("error ") {
                let code = code.trim();
                let Some((status, answered)) = answer_for(code) else {
                    wrong.push(format!("answer {n}: no way to check the error {code}"));
                    continue;
                };
                let expected = format!("`{status} {answered}`");
                if answered != code || !said.contains(&expected) {
                    wrong.push(format!(
                        "answer {n}: the service answers {expected} for {code}, which the answer does not say"
                    ));
                } else {
                    checked += 1;
                }
            } else {
                wrong.push(format!("answer {n}: unknown check {check:?}"));
            }
        }
    }
    Answers {
        blocks: blocks.len(),
        checked,
        wrong,
    }
}

/// What the check of an exercises page found.
struct Answers {
    /// `<details>` blocks.
    blocks: usize,
    /// Facts checked and found right.
    checked: usize,
    wrong: Vec<String>,
}

#[test]
fn every_exercise_answer_is_the_grids_or_the_codes() {
    let root = root();
    let guide = root.join("docs/guide/src");
    let page = std::fs::read_to_string(guide.join("exercises.md")).expect("exercises.md");
    let recorded = std::fs::read_to_string(guide.join("measured/lab.md")).expect("the grid");
    let grid = lab_grid(&recorded);
    assert!(
        grid.get(&("fenced".to_owned(), "2 instances, stall: sale".to_owned()))
            == Some(&"holds".to_owned()),
        "the grid was read: {grid:?}"
    );
    let answers = wrong_answers(&page, &grid);
    let exercises = page.lines().filter(|l| l.starts_with("## ")).count();
    assert!(
        (4..=6).contains(&exercises) && answers.blocks == exercises,
        "{exercises} exercises, {} answers",
        answers.blocks
    );
    assert!(answers.wrong.is_empty(), "{}", answers.wrong.join("\n"));
    assert!(
        answers.checked >= exercises,
        "only {} facts checked",
        answers.checked
    );
    let summary = std::fs::read_to_string(guide.join("SUMMARY.md")).unwrap();
    assert!(
        summary.contains("(exercises.md)"),
        "SUMMARY.md links the exercises"
    );
}

#[test]
fn an_answer_the_grid_or_the_code_contradicts_is_caught() {
    let grid = lab_grid(
        "| strategy | 1 instance, stall: none | 1 instance, stall: crash |\n|---|---|---|\n\
         | `naive` | **oversold 3-5** | · |\n| `fenced` | holds | · |\n",
    );
    let page = |answer: &str| format!("## 1. Q\n\n<details>\n{answer}\n</details>\n");
    let good = page(
        "<!-- check: grid naive | 1 instance, stall: none -->\n`naive`: oversold 3-5; \
         <!-- check: error purchase_in_progress -->`429 purchase_in_progress`",
    );
    let found = wrong_answers(&good, &grid);
    assert_eq!((found.blocks, found.checked), (1, 2), "{:?}", found.wrong);
    assert!(found.wrong.is_empty(), "{:?}", found.wrong);
    for bad in [
        "<!-- check: grid naive | 1 instance, stall: none -->`naive`: oversold 3-6",
        "<!-- check: grid naive | 1 instance, stall: crash -->`naive`: nothing",
        "<!-- check: grid naive | 2 instances, stall: none -->`naive`: oversold 3-5",
        "<!-- check: error purchase_in_progress -->`409 purchase_in_progress`",
        "no source named: `naive` oversold 3-5",
    ] {
        let found = wrong_answers(&page(bad), &grid);
        assert_eq!(found.wrong.len(), 1, "{bad}: {:?}", found.wrong);
    }
}
