//! The support wing: small pieces the other wings share. Questions as env tasks (`data`), the
//! synthetic world's files (`world`), SVG plots of training curves (`plots`) and timing helpers
//! (`timing`).

pub mod data;
pub mod plots;
pub mod timing;
pub mod world;
