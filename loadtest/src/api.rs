//! The admin side of the API that the driver needs: testkit's client, on
//! the instances of a run's target, patient with the refusals of a
//! service whose limits are on.

pub use testkit::{AdminApi as Admin, LabStats, NewSale, SaleMode, Stats};

use crate::service::Target;

impl Target {
    /// The admin API of the first instance.
    pub fn admin(&self) -> Admin {
        self.admin_on(0)
    }

    /// The admin API of instance `i` (counted round the instances).
    pub fn admin_on(&self, i: usize) -> Admin {
        let base = self
            .bases
            .get(i % self.bases.len().max(1))
            .unwrap_or(&self.base);
        // With the service's limits on (`loadtest abuse`), the admin's
        // calls share the driver's address with the connections it opens
        // before a run, and a saturated instance sheds the admin's calls
        // first: a refusal says when to come back.
        Admin::new(base.as_str(), self.admin_token.as_str()).patient(30)
    }
}
