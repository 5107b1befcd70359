//! Helpers shared by the integration tests: one GPU handle for the whole test binary,
//! and a visible notice when a GPU test is skipped for lack of a device.

use std::io::Write;
use std::sync::{Mutex, MutexGuard, OnceLock};

use host::{Error, Gpu, GpuGroup};
use proptest::test_runner::{Config, TestRunner};

/// The first device, shared by the tests of one binary; `None`, with a notice on
/// stderr, when the machine has no usable CUDA device.
pub fn gpu_or_skip(test: &str) -> Option<MutexGuard<'static, Gpu>> {
    static GPU: OnceLock<Result<Mutex<Gpu>, String>> = OnceLock::new();
    shared(&GPU, Gpu::new, test)
}

/// The first device with its portable kernels only ([`Gpu::with_portable_kernels`]:
/// `mma.sync` instead of `wgmma` on Hopper), for the paths other devices take.
pub fn portable_gpu_or_skip(test: &str) -> Option<MutexGuard<'static, Gpu>> {
    static GPU: OnceLock<Result<Mutex<Gpu>, String>> = OnceLock::new();
    shared(&GPU, || Gpu::with_portable_kernels(0), test)
}

/// Every device of the machine as one group (NCCL), shared by the tests of one binary;
/// `None`, with a notice on stderr, when the machine has no usable CUDA device. A
/// device without NCCL fails the test.
pub fn group_or_skip(test: &str) -> Option<MutexGuard<'static, GpuGroup>> {
    static GROUP: OnceLock<Result<Mutex<GpuGroup>, String>> = OnceLock::new();
    shared(&GROUP, GpuGroup::all, test)
}

/// Three ranks on the first device, exchanging by device copies: the group's logic at
/// more than one rank on any machine with a GPU.
pub fn three_rank_group_or_skip(test: &str) -> Option<MutexGuard<'static, GpuGroup>> {
    static GROUP: OnceLock<Result<Mutex<GpuGroup>, String>> = OnceLock::new();
    shared(&GROUP, || GpuGroup::on_one_device(0, 3), test)
}

fn shared<H>(
    handle: &'static OnceLock<Result<Mutex<H>, String>>,
    open: impl FnOnce() -> Result<H, Error>,
    test: &str,
) -> Option<MutexGuard<'static, H>> {
    let opened = handle.get_or_init(|| match open() {
        Ok(gpu) => Ok(Mutex::new(gpu)),
        Err(e @ Error::NoDevice { .. }) => Err(e.to_string()),
        Err(e) => panic!("a CUDA device is present but could not be opened: {e}"),
    });
    match opened {
        Ok(gpu) => Some(gpu.lock().unwrap_or_else(|poisoned| poisoned.into_inner())),
        Err(reason) => {
            // Written past the test harness's capture, so the skip shows in the output.
            let _ = writeln!(std::io::stderr(), "SKIPPED (no GPU) {test}: {reason}");
            None
        }
    }
}

/// A property-test runner: 256 cases unless `PROPTEST_CASES` says otherwise (the
/// sanitizer runs use few).
pub fn runner() -> TestRunner {
    TestRunner::new(Config::default())
}

/// A stream of pseudo-random 64-bit words (xorshift64*) from `seed`: distinct,
/// non-constant test data, the same for the same seed.
pub fn random_words(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed | 1;
    move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}
