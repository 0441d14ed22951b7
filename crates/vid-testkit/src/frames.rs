//! Comparing video frames and images by eye, in tests: a 16×16 grey
//! thumbnail made by the ffmpeg CLI (an implementation the code under test
//! does not share), and the mean difference of two such thumbnails.

use std::path::Path;
use std::process::Command;

/// A grey 16×16 thumbnail (256 bytes, row-major) of the first frame of
/// `path` (a video or an image), or of its frame at `at` seconds, as the
/// ffmpeg CLI shows it (autorotate on). Panics when ffmpeg fails.
pub fn grey_thumbnail(path: &Path, at: Option<f64>) -> Vec<u8> {
    let seek: Vec<String> = at.map(|t| vec!["-ss".to_owned(), t.to_string()]).unwrap_or_default();
    let out = Command::new("ffmpeg")
        .args(["-v", "error", "-nostdin"])
        .args(&seek)
        .arg("-i")
        .arg(path)
        .args(["-frames:v", "1", "-vf", "scale=16:16:flags=area,format=gray", "-f", "rawvideo", "-"])
        .output()
        .expect("ffmpeg runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout.len(), 256, "a 16×16 grey frame of {}", path.display());
    out.stdout
}

/// Mean absolute difference of two thumbnails (0–255).
pub fn diff(a: &[u8], b: &[u8]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).abs()).sum::<f64>() / a.len() as f64
}
