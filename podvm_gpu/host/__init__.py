"""The only code that touches the operating system: paths under the root, processes, udev, kmsg."""
