//! TEMPORARY placeholder (not committed): replaced by the helper's module.
use crate::base::error::{Error, Result};
use crate::engine::ops_moe_v1::MoeKernel;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::model::config::ModelConfig;
use crate::model::layers::tp::TpShard;
use crate::model::loader::Loader;
use std::cell::RefCell;
pub struct DeepseekMoe {
    pub gate: Tensor,
}
impl DeepseekMoe {
    pub fn weight_bytes(&self) -> u64 {
        self.gate.nbytes()
    }
}
pub fn load_deepseek_moe(
    _ld: &mut Loader,
    _cfg: &ModelConfig,
    _shard: &TpShard,
    _p: &str,
) -> Result<DeepseekMoe> {
    Err(Error::Request("moe: placeholder".into()))
}
pub fn deepseek_moe_forward(
    _rt: &Runtime,
    _x: Tensor,
    _m: &DeepseekMoe,
    _cfg: &ModelConfig,
    _k: (DType, MoeKernel, Option<&RefCell<Option<Tensor>>>),
    _l: &str,
    _gpu: &str,
) -> Result<Tensor> {
    Err(Error::Request("moe: placeholder".into()))
}
