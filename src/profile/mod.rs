//! The measurement procedure of FORMULAS.md, the formulas, and the Report they produce.

pub mod formulas;
pub mod procedure;
pub mod report;
pub mod request;

pub use procedure::run;
pub use report::Report;
pub use request::ProfileRequest;
