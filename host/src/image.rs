//! The PTX and cubins embedded at build time, and the choice of one for a device.

use crate::Error;

/// How an embedded image is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ImageFormat {
    /// Machine code, loaded as is on the same major architecture.
    Cubin,
    /// PTX, compiled by the driver for any device at least as new.
    Ptx,
}

/// One embedded build of the kernels.
#[derive(Debug)]
pub(crate) struct KernelImage {
    /// `sm_XY`.
    pub arch: &'static str,
    pub format: ImageFormat,
    /// The image, LZ4-compressed with its size prepended.
    pub lz4: &'static [u8],
}

impl KernelImage {
    /// The image itself.
    pub fn decompress(&self) -> Result<Vec<u8>, Error> {
        lz4_flex::decompress_size_prepended(self.lz4).map_err(|e| Error::CorruptKernelImage {
            arch: self.arch,
            detail: e.to_string(),
        })
    }

    /// Whether the image is for an architecture-specific target (`sm_90a`), which runs
    /// only on devices of exactly its capability.
    pub fn arch_specific(&self) -> bool {
        self.arch.ends_with('a')
    }

    /// The compute capability the image was built for.
    pub fn capability(&self) -> (u32, u32) {
        let digits = self
            .arch
            .trim_start_matches("sm_")
            .trim_end_matches(|c: char| !c.is_ascii_digit());
        let n: u32 = digits.parse().unwrap_or(0);
        (n / 10, n % 10)
    }
}

pub(crate) static KERNEL_IMAGES: &[KernelImage] = include!(concat!(env!("OUT_DIR"), "/kernel_images.rs"));

/// The best image for a device: a cubin of the same major architecture and no newer
/// minor one (an architecture-specific one first, where it is the device's exact
/// capability and `arch_specific` allows it), else the newest PTX not newer than the
/// device.
pub(crate) fn select(
    images: &'static [KernelImage],
    device: (u32, u32),
    arch_specific: bool,
) -> Option<&'static KernelImage> {
    let cubin = images
        .iter()
        .filter(|i| i.format == ImageFormat::Cubin)
        .filter(|i| i.capability().0 == device.0 && i.capability() <= device)
        .filter(|i| !i.arch_specific() || (arch_specific && i.capability() == device))
        .max_by_key(|i| (i.capability(), i.arch_specific()));
    cubin.or_else(|| {
        images
            .iter()
            .filter(|i| i.format == ImageFormat::Ptx && i.capability() <= device)
            .max_by_key(|i| i.capability())
    })
}

/// The architectures embedded, for error messages.
pub(crate) fn describe(images: &[KernelImage]) -> String {
    let mut arches: Vec<_> = images.iter().map(|i| i.arch).collect();
    arches.dedup();
    arches.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    static IMAGES: &[KernelImage] = &[
        KernelImage {
            arch: "sm_80",
            format: ImageFormat::Cubin,
            lz4: b"",
        },
        KernelImage {
            arch: "sm_90",
            format: ImageFormat::Cubin,
            lz4: b"",
        },
        KernelImage {
            arch: "sm_90a",
            format: ImageFormat::Cubin,
            lz4: b"",
        },
        KernelImage {
            arch: "sm_90",
            format: ImageFormat::Ptx,
            lz4: b"",
        },
    ];

    fn chosen(device: (u32, u32)) -> Option<(&'static str, ImageFormat)> {
        select(IMAGES, device, true).map(|i| (i.arch, i.format))
    }

    #[test]
    fn picks_cubin_of_same_major_else_newest_older_ptx() {
        assert_eq!(chosen((9, 0)), Some(("sm_90a", ImageFormat::Cubin)));
        assert_eq!(chosen((9, 1)), Some(("sm_90", ImageFormat::Cubin)));
        let portable = select(IMAGES, (9, 0), false).map(|i| (i.arch, i.format));
        assert_eq!(portable, Some(("sm_90", ImageFormat::Cubin)));
        assert_eq!(chosen((8, 6)), Some(("sm_80", ImageFormat::Cubin)));
        assert_eq!(chosen((8, 9)), Some(("sm_80", ImageFormat::Cubin)));
        assert_eq!(chosen((10, 0)), Some(("sm_90", ImageFormat::Ptx)));
        assert_eq!(chosen((12, 0)), Some(("sm_90", ImageFormat::Ptx)));
        assert_eq!(chosen((7, 5)), None);
    }

    #[test]
    fn embedded_images_are_every_cubin_and_the_newest_ptx() {
        let embedded = |arch: &str, format| {
            KERNEL_IMAGES
                .iter()
                .find(|i| i.arch == arch && i.format == format)
                .is_some_and(|i| !i.lz4.is_empty())
        };
        assert!(
            ["sm_80", "sm_90", "sm_90a"]
                .iter()
                .all(|arch| embedded(arch, ImageFormat::Cubin))
        );
        assert!(embedded("sm_90", ImageFormat::Ptx));
        assert!(!embedded("sm_80", ImageFormat::Ptx) && !embedded("sm_90a", ImageFormat::Ptx));
        assert_eq!(describe(KERNEL_IMAGES), "sm_80, sm_90, sm_90a");
    }

    #[test]
    fn embedded_images_decompress_to_cubins_and_ptx() {
        for image in KERNEL_IMAGES {
            let bytes = image.decompress().expect("an embedded image decompresses");
            match image.format {
                ImageFormat::Cubin => assert_eq!(&bytes[..4], b"\x7fELF", "{} cubin", image.arch),
                ImageFormat::Ptx => {
                    let text = std::str::from_utf8(&bytes).expect("PTX is text");
                    assert!(text.contains(".entry conv_"), "{} PTX", image.arch);
                }
            }
        }
    }

    #[test]
    fn a_damaged_image_is_an_error() {
        let damaged = KernelImage {
            arch: "sm_90",
            format: ImageFormat::Cubin,
            lz4: b"\x40\x00\x00\x00\xff\xff",
        };
        assert!(matches!(
            damaged.decompress(),
            Err(Error::CorruptKernelImage { arch: "sm_90", .. })
        ));
    }
}
