//! Tensors: a shape, a dtype, a block of the framework allocator, and (in compute modes) the
//! data. Dropping a tensor frees its block, as a PyTorch tensor does.

use serde::{Deserialize, Serialize};

use crate::engine::runtime::Runtime;
use crate::memory::{BlockRef, Category};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F16,
    BF16,
    I8,
    U8,
    I32,
    I64,
}

impl DType {
    pub fn size_bytes(self) -> u64 {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 => 1,
            DType::I64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }
}

/// Where a tensor's values are. Host storage keeps float tensors as f32 whatever their
/// accounted dtype (compute mode accumulates in f32); the bytes the allocator counts follow the
/// dtype, as on the GPU.
#[derive(Debug)]
pub enum Storage {
    /// Dry run: shapes and allocations only.
    None,
    F32(Vec<f32>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    I32(Vec<i32>),
    /// Device pointer: the block's segment base plus its offset.
    Cuda(u64),
}

pub struct Tensor {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub name: String,
    pub category: Category,
    pub storage: Storage,
    pub(crate) block: BlockRef,
    pub(crate) rt: Runtime,
    /// A part of another tensor's block (a `split` view): it frees nothing when dropped.
    pub(crate) view: bool,
}

impl Tensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes the data takes at its dtype (before allocator rounding).
    pub fn nbytes(&self) -> u64 {
        self.numel() as u64 * self.dtype.size_bytes()
    }

    /// Rounded bytes the framework allocator handed out for it.
    pub fn block_bytes(&self) -> u64 {
        self.block.bytes
    }

    pub fn f32(&self) -> &[f32] {
        match &self.storage {
            Storage::F32(v) => v,
            other => panic!("tensor {} is not host f32 ({other:?})", self.name),
        }
    }

    pub fn f32_mut(&mut self) -> &mut [f32] {
        match &mut self.storage {
            Storage::F32(v) => v,
            _ => panic!("tensor {} is not host f32", self.name),
        }
    }

    pub fn i8(&self) -> &[i8] {
        match &self.storage {
            Storage::I8(v) => v,
            _ => panic!("tensor {} is not host i8", self.name),
        }
    }

    pub fn u8(&self) -> &[u8] {
        match &self.storage {
            Storage::U8(v) => v,
            _ => panic!("tensor {} is not host u8", self.name),
        }
    }

    pub fn u8_mut(&mut self) -> &mut [u8] {
        match &mut self.storage {
            Storage::U8(v) => v,
            _ => panic!("tensor {} is not host u8", self.name),
        }
    }

    /// Host values of an i32 or i64 tensor (the host keeps both as i32: indices fit).
    pub fn i32(&self) -> &[i32] {
        match &self.storage {
            Storage::I32(v) => v,
            _ => panic!("tensor {} is not host i32", self.name),
        }
    }

    pub fn i32_mut(&mut self) -> &mut [i32] {
        match &mut self.storage {
            Storage::I32(v) => v,
            _ => panic!("tensor {} is not host i32", self.name),
        }
    }

    pub fn cuda_ptr(&self) -> u64 {
        match &self.storage {
            Storage::Cuda(p) => *p,
            _ => panic!("tensor {} is not on a CUDA device", self.name),
        }
    }

    /// A contiguous part of this tensor's block, `shape` elements from element `offset`, as
    /// PyTorch's `split`/slicing gives a view: no allocation, and dropping it frees nothing.
    /// On a GPU it points into the block; the host keeps a copy of those values (the parent's
    /// values are never read again after a split in the forward passes that use it).
    /// The caller keeps the parent alive while the view is used.
    pub fn part(&self, name: impl Into<String>, offset: usize, shape: &[usize]) -> Tensor {
        let numel: usize = shape.iter().product();
        assert!(
            offset + numel <= self.numel(),
            "part of {} out of range",
            self.name
        );
        let storage = match &self.storage {
            Storage::None => Storage::None,
            Storage::F32(v) if v.is_empty() => Storage::F32(vec![0.0; numel]),
            Storage::F32(v) => Storage::F32(self.rt.host_copy(&v[offset..offset + numel])),
            Storage::I8(v) => Storage::I8(v[offset..offset + numel].to_vec()),
            Storage::U8(v) => Storage::U8(v[offset..offset + numel].to_vec()),
            Storage::I32(v) => Storage::I32(v[offset..offset + numel].to_vec()),
            Storage::Cuda(p) => Storage::Cuda(p + offset as u64 * self.dtype.size_bytes()),
        };
        Tensor {
            shape: shape.to_vec(),
            dtype: self.dtype,
            name: name.into(),
            category: self.category,
            storage,
            block: self.block,
            rt: self.rt.clone(),
            view: true,
        }
    }

    /// Rows of a 2-D tensor.
    pub fn rows(&self) -> usize {
        self.shape[0]
    }

    /// Length of the last dimension.
    pub fn cols(&self) -> usize {
        *self.shape.last().unwrap_or(&1)
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor({} {:?} {})",
            self.name,
            self.shape,
            self.dtype.name()
        )
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        if !self.view {
            self.rt.release(self.block, &self.name, self.category);
        }
        // Activations only: a pass makes them again; weights die once, with the model.
        if let (Storage::F32(v), Category::Activation) = (&mut self.storage, self.category) {
            self.rt.recycle_host(std::mem::take(v));
        }
    }
}
