//! Tensors: a shape, a dtype, a block of the framework allocator, and (in compute modes) the
//! data. Dropping a tensor frees its block, as a PyTorch tensor does.

use crate::engine::runtime::Runtime;
use crate::memory::{BlockRef, Category};

pub use crate::device::tensor::{DType, Storage, TensorData};

/// A tensor of the framework: its data, the category it is logged under, and the allocator
/// block it owns. Field access reaches the data (`t.shape`, `t.storage`) through `Deref`.
pub struct Tensor {
    pub data: TensorData,
    pub category: Category,
    pub(crate) block: BlockRef,
    pub(crate) rt: Runtime,
    /// A part of another tensor's block (a `split` view): it frees nothing when dropped.
    pub(crate) view: bool,
}

impl std::ops::Deref for Tensor {
    type Target = TensorData;
    fn deref(&self) -> &TensorData {
        &self.data
    }
}

impl std::ops::DerefMut for Tensor {
    fn deref_mut(&mut self) -> &mut TensorData {
        &mut self.data
    }
}

impl Tensor {
    /// Rounded bytes the framework allocator handed out for it.
    pub fn block_bytes(&self) -> u64 {
        self.block.bytes
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
            data: TensorData {
                shape: shape.to_vec(),
                dtype: self.dtype,
                name: name.into(),
                storage,
            },
            category: self.category,
            block: self.block,
            rt: self.rt.clone(),
            view: true,
        }
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
        if let (Storage::F32(v), Category::Activation) = (&mut self.data.storage, self.category) {
            self.rt.recycle_host(std::mem::take(v));
        }
    }
}
