//! What a device kernel sees of a tensor: its shape, dtype, name and where its values are. The
//! engine's `Tensor` wraps this with the allocator block that owns the bytes, so device code
//! never needs the layers above it.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F16,
    BF16,
    I8,
    U8,
    /// float8_e4m3fn (vLLM's fp8 weights and activations); the host keeps its codes as u8.
    F8E4M3,
    I32,
    I64,
}

impl DType {
    pub fn size_bytes(self) -> u64 {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 | DType::F8E4M3 => 1,
            DType::I64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// `v` rounded to this dtype and back, as a PyTorch cast to it stores it (floats only;
    /// other dtypes return `v`).
    pub fn round(self, v: f32) -> f32 {
        match self {
            DType::F16 => half::f16::from_f32(v).to_f32(),
            DType::BF16 => half::bf16::from_f32(v).to_f32(),
            _ => v,
        }
    }

    /// `round` of every value in place, eight at a time through the CPU's conversion
    /// instructions (F16C where present): the same values as `round` one by one.
    pub fn round_slice(self, xs: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        const CHUNK: usize = 1024;
        match self {
            DType::F16 => {
                let mut buf = [half::f16::ZERO; CHUNK];
                for c in xs.chunks_mut(CHUNK) {
                    let b = &mut buf[..c.len()];
                    b.convert_from_f32_slice(c);
                    b.convert_to_f32_slice(c);
                }
            }
            DType::BF16 => {
                let mut buf = [half::bf16::ZERO; CHUNK];
                for c in xs.chunks_mut(CHUNK) {
                    let b = &mut buf[..c.len()];
                    b.convert_from_f32_slice(c);
                    b.convert_to_f32_slice(c);
                }
            }
            _ => {}
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::F8E4M3 => "f8_e4m3",
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

/// A tensor's description and values, without ownership of its memory.
pub struct TensorData {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub name: String,
    pub storage: Storage,
}

/// Host accessors: a tensor's values as a slice of its host storage type; asking for the
/// wrong one is a bug in an op, and panics with the tensor's name.
macro_rules! host_views {
    ($($get:ident, $get_mut:ident: $variant:ident as $t:ty, $what:literal;)*) => {
        $(
            pub fn $get(&self) -> &[$t] {
                match &self.storage {
                    Storage::$variant(v) => v,
                    other => panic!("tensor {} is not host {} ({other:?})", self.name, $what),
                }
            }

            pub fn $get_mut(&mut self) -> &mut [$t] {
                match &mut self.storage {
                    Storage::$variant(v) => v,
                    other => panic!("tensor {} is not host {} ({other:?})", self.name, $what),
                }
            }
        )*
    };
}

impl TensorData {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes the data takes at its dtype (before allocator rounding).
    pub fn nbytes(&self) -> u64 {
        self.numel() as u64 * self.dtype.size_bytes()
    }

    host_views! {
        f32, f32_mut: F32 as f32, "f32";
        i8, i8_mut: I8 as i8, "i8";
        u8, u8_mut: U8 as u8, "u8";
        // i32 and i64 tensors: the host keeps both as i32 (indices fit).
        i32, i32_mut: I32 as i32, "i32";
    }

    pub fn cuda_ptr(&self) -> u64 {
        match &self.storage {
            Storage::Cuda(p) => *p,
            _ => panic!("tensor {} is not on a CUDA device", self.name),
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

#[cfg(test)]
mod tests {
    use super::DType;

    /// The vectorised rounding gives `round`'s values bit for bit, over normals, subnormals,
    /// ties, overflow and a length that is not a multiple of the chunk.
    #[test]
    fn round_slice_is_round_value_by_value() {
        let mut xs: Vec<f32> = (0..5000i32)
            .map(|i| {
                let t = i as f32;
                (t * 0.377).sin() * 10f32.powi(i % 13 - 8)
            })
            .collect();
        xs.extend([
            65504.0,
            65520.0,
            1e6,
            -1e6,
            6e-8,
            3e-8,
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            f32::INFINITY,
            -0.0,
        ]);
        for dt in [DType::F16, DType::BF16, DType::F32] {
            let mut v = xs.clone();
            dt.round_slice(&mut v);
            for (a, &x) in v.iter().zip(&xs) {
                assert_eq!(a.to_bits(), dt.round(x).to_bits(), "{dt:?} {x}");
            }
        }
    }
}
