//! The one route table: every route of the API declared once, with its
//! class (which limits cover it, and how critical it is when the instance
//! sheds load); its path, method and OpenAPI description are its handler's
//! own annotation. The router, the OpenAPI document and the classifier the
//! outer middleware consult before routing all come from here.

use std::sync::Arc;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{get, MethodRouter};
use axum::{Extension, Router};
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter};
use utoipa_axum::routes;

use super::limit::RouteClass;
use super::openapi::{self, DocumentJson};
use super::shed::Criticality;
use super::state::AppState;
use super::{admin, demo, events, lifecycle, monitor, ops, queue, sale, shop};

/// A route's class: the limits' and the shedder's view of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Class {
    pub limit: RouteClass,
    /// `None`: never shed (the probes).
    pub shed: Option<Criticality>,
}

impl Class {
    /// What a request that matches no route is: least critical.
    const UNMATCHED: Self = Self {
        limit: RouteClass::Unmatched,
        shed: Some(Criticality::Reads),
    };

    fn of(limit: RouteClass) -> Self {
        Self {
            limit,
            shed: Some(Criticality::of(limit)),
        }
    }

    fn probe() -> Self {
        Self {
            limit: RouteClass::Ops,
            shed: None,
        }
    }
}

/// Every route's class by its path, for the middleware that runs before
/// routing. Cheap to clone.
#[derive(Clone)]
pub struct Classes(Arc<matchit::Router<Class>>);

impl Classes {
    /// The class of the route `path` (a request's own path) matches.
    pub fn of(&self, path: &str) -> Class {
        self.0
            .at(path)
            .map_or(Class::UNMATCHED, |found| *found.value)
    }
}

/// The outermost layer: classifies the request by the route table once,
/// for the limits and the shedder after it.
pub async fn classify(
    axum::extract::State(classes): axum::extract::State<Classes>,
    mut request: Request,
    next: Next,
) -> Response {
    let class = classes.of(request.uri().path());
    let shed = shed_class(class, request.headers());
    let extensions = request.extensions_mut();
    extensions.insert(class.limit);
    if let Some(criticality) = shed {
        extensions.insert(criticality);
    }
    next.run(request).await
}

/// How a request of `class` is shed: as its route's class, but a buyer's
/// route without a bearer token (answered 401 whatever the instance's
/// load) as a read, first, not as the sale's: tokenless floods on the
/// purchase route pushed the shedder to refuse every other class, then
/// honest buyers.
fn shed_class(class: Class, headers: &axum::http::HeaderMap) -> Option<Criticality> {
    match class.shed {
        Some(_) if class.limit.per_user() && super::extract::bearer(headers).is_err() => {
            Some(Criticality::of(RouteClass::Reads))
        }
        shed => shed,
    }
}

/// A mounted crate's routes, with the class of each of its paths.
pub type Mounted = (Router<AppState>, Vec<(String, RouteClass)>);

/// The routes, the description and the classes, built together.
pub struct Table {
    pub router: Router<AppState>,
    /// The admin routes, apart: whoever serves them puts the admin token's
    /// check in front of them all (`http::router`).
    pub admin: Router<AppState>,
    pub classes: Classes,
}

/// The table: the API's routes (`/metrics` among them only where it is
/// `public_metrics`, though it is always described) and `mounted`'s, each
/// of its paths with its class.
pub fn table(public_metrics: bool, mounted: Option<Mounted>) -> Table {
    use RouteClass::{Orders, Payments, Purchase, Queue, Reads};
    let mut table = Builder::default()
        .documented(Class::of(Purchase), routes!(sale::purchase))
        .documented(Class::of(Queue), routes!(queue::join, queue::poll))
        .documented(Class::of(Orders), routes!(sale::get_order))
        .documented(Class::of(Orders), routes!(lifecycle::cancel_order))
        .documented(Class::of(Payments), routes!(lifecycle::notify))
        .documented(Class::of(Reads), routes!(sale::list_vouchers))
        .documented(Class::of(Reads), routes!(sale::get_voucher))
        .admin(routes!(admin::create_voucher))
        .admin(routes!(admin::voucher_orders))
        .admin(routes!(admin::voucher_stats))
        .admin(routes!(monitor::monitor))
        .admin(routes!(admin::restock))
        .admin(routes!(admin::reconcile))
        .admin(routes!(admin::mint_tokens))
        .admin(routes!(events::feed))
        .admin(routes!(events::failed))
        .admin(routes!(events::retry))
        .documented(Class::of(Reads), routes!(demo::new_user))
        .documented(Class::of(Orders), routes!(demo::pay))
        .documented(Class::probe(), routes!(ops::healthz))
        .documented(Class::probe(), routes!(ops::readyz));
    table = if public_metrics {
        table.documented(Class::probe(), routes!(ops::metrics))
    } else {
        table.described_only(routes!(ops::metrics))
    };
    let ops = Class::of(RouteClass::Ops);
    table = table
        .plain(ops, "/docs", get(openapi::docs))
        .plain(ops, "/docs/", get(openapi::docs))
        .plain(ops, "/docs/{*file}", get(openapi::docs_file));
    // The storefront and the monitor: pages, not API (outside the
    // description), shed first like any read.
    let pages = Class::of(Reads);
    table = table
        .plain(pages, "/shop", get(shop::shop_root))
        .plain(pages, "/shop/", get(shop::buyer))
        .plain(pages, "/shop/vouchers/{id}", get(shop::buyer_voucher))
        .plain(pages, "/shop/monitor", get(shop::monitor))
        .plain(pages, "/shop/assets/{file}", get(shop::asset));
    if let Some((routes, classes)) = mounted {
        table = table.mounted(routes, classes);
    }
    table.finish()
}

#[derive(Default)]
struct Builder {
    api: OpenApiRouter<AppState>,
    /// The admin class's routes, described as one (`openapi::describe_admin`).
    admin: OpenApiRouter<AppState>,
    classes: matchit::Router<Class>,
    /// Routes outside the description: the docs' own, a mount's.
    plain: Router<AppState>,
}

impl Builder {
    /// A route described by its handler's annotation.
    fn documented(mut self, class: Class, route: UtoipaMethodRouter<AppState>) -> Self {
        self.classify_all(&route.1, class);
        self.api = self.api.routes(route);
        self
    }

    /// An admin route: the admin class, and the admin's tag, token and
    /// refusals in its description.
    fn admin(mut self, route: UtoipaMethodRouter<AppState>) -> Self {
        self.classify_all(&route.1, Class::of(RouteClass::Admin));
        self.admin = self.admin.routes(route);
        self
    }

    /// A route described but served elsewhere (`/metrics` on its own
    /// address): a probe here, so that its description carries no `503`.
    fn described_only(mut self, route: UtoipaMethodRouter<AppState>) -> Self {
        let (_, paths, _) = route;
        self.classify_all(&paths, Class::probe());
        self.api.get_openapi_mut().paths.paths.extend(paths.paths);
        self
    }

    /// A route outside the description.
    fn plain(mut self, class: Class, path: &str, route: MethodRouter<AppState>) -> Self {
        self.classify(path, class);
        self.plain = self.plain.route(path, route);
        self
    }

    /// A mount's routes, with the class of each of its paths.
    fn mounted(mut self, routes: Router<AppState>, classes: Vec<(String, RouteClass)>) -> Self {
        for (path, class) in classes {
            self.classify(&path, Class::of(class));
        }
        self.plain = self.plain.merge(routes);
        self
    }

    /// Every path a handler's description names, as `class`.
    fn classify_all(&mut self, paths: &utoipa::openapi::path::Paths, class: Class) {
        for path in paths.paths.keys() {
            self.classify(path, class);
        }
    }

    fn classify(&mut self, path: &str, class: Class) {
        // A path with several methods is classified once: by its first.
        let _ = self.classes.insert(path, class);
    }

    fn finish(mut self) -> Table {
        self.classify("/openapi.json", Class::of(RouteClass::Ops));
        let (admin, mut admin_paths) = self.admin.split_for_parts();
        openapi::describe_admin(&mut admin_paths);
        let (router, mut paths) = self.api.split_for_parts();
        paths.merge(admin_paths);
        let classes = Classes(Arc::new(self.classes));
        let document = openapi::document(paths, |path| classes.of(path).shed.is_some());
        let json = serde_json::to_vec(&document).expect("the description serializes");
        let json = Extension(DocumentJson(json.into()));
        let router = router.merge(self.plain);
        let router = router.route("/openapi.json", get(openapi::openapi_json).layer(json));
        Table {
            router,
            admin,
            classes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes() -> Classes {
        table(true, None).classes
    }

    #[test]
    fn every_route_has_its_class_and_the_probes_are_never_shed() {
        let classes = classes();
        let limit = |path| classes.of(path).limit;
        assert_eq!(limit("/seckill/1"), RouteClass::Purchase);
        assert_eq!(limit("/orders/7/cancel"), RouteClass::Orders);
        assert_eq!(limit("/orders/7"), RouteClass::Orders);
        assert_eq!(limit("/vouchers/1/queue"), RouteClass::Queue);
        assert_eq!(limit("/vouchers/1"), RouteClass::Reads);
        assert_eq!(limit("/vouchers"), RouteClass::Reads);
        assert_eq!(limit("/admin/tokens"), RouteClass::Admin);
        assert_eq!(limit("/admin/webhooks/retry"), RouteClass::Admin);
        assert_eq!(limit("/payments/notify"), RouteClass::Payments);
        assert_eq!(limit("/readyz"), RouteClass::Ops);
        assert_eq!(limit("/docs/index.css"), RouteClass::Ops);
        assert_eq!(limit("/shop/"), RouteClass::Reads);
        assert_eq!(limit("/shop/assets/shop.js"), RouteClass::Reads);
        assert_eq!(limit("/admin/vouchers/1/monitor"), RouteClass::Admin);
        assert_eq!(limit("/demo/orders/7/pay"), RouteClass::Orders);
        let shed = |path| classes.of(path).shed;
        assert_eq!(shed("/seckill/1"), Some(Criticality::Sale));
        assert_eq!(shed("/vouchers/1/queue"), Some(Criticality::Sale));
        assert_eq!(shed("/payments/notify"), Some(Criticality::Orders));
        assert_eq!(shed("/orders/7/cancel"), Some(Criticality::Orders));
        assert_eq!(shed("/vouchers/1"), Some(Criticality::Reads));
        assert_eq!(shed("/readyz"), None);
        assert_eq!(shed("/admin/vouchers"), Some(Criticality::Admin));
        assert_eq!(shed("/healthz"), None);
        assert_eq!(shed("/metrics"), None);
    }

    #[test]
    fn a_buyers_route_without_a_bearer_token_is_shed_as_a_read() {
        let classes = classes();
        let bearer = crate::http::one_header("authorization", "Bearer some.token");
        let none = axum::http::HeaderMap::new();
        let basic = crate::http::one_header("authorization", "Basic dXNlcg==");
        for (path, class) in [
            ("/seckill/1", Criticality::Sale),
            ("/vouchers/1/queue", Criticality::Sale),
            ("/orders/7", Criticality::Orders),
        ] {
            let of = classes.of(path);
            assert_eq!(shed_class(of, &bearer), Some(class), "{path}");
            assert_eq!(shed_class(of, &none), Some(Criticality::Reads), "{path}");
            assert_eq!(shed_class(of, &basic), Some(Criticality::Reads), "{path}");
        }
        // Other routes keep their class, with a token or without.
        let notify = classes.of("/payments/notify");
        assert_eq!(shed_class(notify, &none), Some(Criticality::Orders));
        assert_eq!(shed_class(classes.of("/healthz"), &none), None);
        assert_eq!(
            shed_class(classes.of("/admin/vouchers"), &none),
            Some(Criticality::Admin)
        );
    }

    #[test]
    fn a_path_of_no_route_is_unmatched_and_shed_first() {
        let classes = classes();
        for path in [
            "/",
            "/nope",
            "/seckill",
            "/seckill/1/2",
            "/vouchers/1/queue/x",
        ] {
            assert_eq!(classes.of(path), Class::UNMATCHED, "{path}");
        }
    }

    #[test]
    fn a_mounts_paths_take_the_classes_it_declares() {
        let mounted = (
            Router::new(),
            vec![(
                "/lab/{strategy}/seckill/{id}".to_owned(),
                RouteClass::Purchase,
            )],
        );
        let classes = table(true, Some(mounted)).classes;
        assert_eq!(
            classes.of("/lab/naive/seckill/3").limit,
            RouteClass::Purchase
        );
    }

    #[test]
    fn metrics_is_a_probe_whether_served_here_or_on_its_own_address() {
        for public_metrics in [true, false] {
            let Table { classes, .. } = table(public_metrics, None);
            assert_eq!(classes.of("/metrics").shed, None);
        }
    }
}
