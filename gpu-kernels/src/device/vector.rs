//! Elements packed in 128-bit vectors, as the vector loads and stores move them: four
//! 32-bit words holding eight 2-byte, four 4-byte or two 8-byte elements.

/// A 2-, 4- or 8-byte element of a 128-bit vector.
pub trait VectorElement: Copy {
    /// Elements in one vector.
    const PER_VECTOR: usize;
    /// Element `i` of a vector loaded as four words.
    fn from_words(words: [u32; 4], i: usize) -> Self;
    /// Writes the element into its place `i` of a vector.
    fn into_words(self, words: &mut [u32; 4], i: usize);
}

macro_rules! vector_element_32 {
    ($($t:ty => $to:expr, $from:expr;)*) => {$(
        impl VectorElement for $t {
            const PER_VECTOR: usize = 4;
            #[inline(always)]
            fn from_words(words: [u32; 4], i: usize) -> Self {
                $from(words[i])
            }
            #[inline(always)]
            fn into_words(self, words: &mut [u32; 4], i: usize) {
                words[i] = $to(self);
            }
        }
    )*};
}

macro_rules! vector_element_64 {
    ($($t:ty => $to:expr, $from:expr;)*) => {$(
        impl VectorElement for $t {
            const PER_VECTOR: usize = 2;
            #[inline(always)]
            fn from_words(words: [u32; 4], i: usize) -> Self {
                $from(words[2 * i] as u64 | (words[2 * i + 1] as u64) << 32)
            }
            #[inline(always)]
            fn into_words(self, words: &mut [u32; 4], i: usize) {
                let bits: u64 = $to(self);
                words[2 * i] = bits as u32;
                words[2 * i + 1] = (bits >> 32) as u32;
            }
        }
    )*};
}

macro_rules! vector_element_16 {
    ($($t:ty => $to:expr, $from:expr;)*) => {$(
        impl VectorElement for $t {
            const PER_VECTOR: usize = 8;
            #[inline(always)]
            fn from_words(words: [u32; 4], i: usize) -> Self {
                $from((words[i / 2] >> (16 * (i % 2))) as u16)
            }
            #[inline(always)]
            fn into_words(self, words: &mut [u32; 4], i: usize) {
                let shift = 16 * (i % 2);
                let bits: u16 = $to(self);
                words[i / 2] = (words[i / 2] & !(0xffff << shift)) | (bits as u32) << shift;
            }
        }
    )*};
}

vector_element_16! {
    half::bf16 => half::bf16::to_bits, half::bf16::from_bits;
    half::f16 => half::f16::to_bits, half::f16::from_bits;
}

vector_element_32! {
    f32 => f32::to_bits, f32::from_bits;
    i32 => |v: i32| v as u32, |w: u32| w as i32;
}

vector_element_64! {
    f64 => f64::to_bits, f64::from_bits;
    i64 => |v: i64| v as u64, |w: u64| w as i64;
}
