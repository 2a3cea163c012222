mod demo;
mod sim;

fn main() {}
