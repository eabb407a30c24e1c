// The toolledger Android library module: the UniFFI Kotlin bindings
// (package dev.toolledger), the hand-written layer (dev.toolledger.ktx) and
// libtoolledger.so for every Android ABI; published as an AAR
// (dev.toolledger:toolledger-android) with maven-publish.
//
// Not self-contained on purpose: plugin versions come from the app that
// includes this module (settings.gradle.kts of the app):
//
//     include(":toolledger")
//     project(":toolledger").projectDir = file("<path to toolledger>/platforms/android")
//
// Before the first Gradle build, run platforms/android/build-rust.sh: it
// cross-compiles the Rust library into src/main/jniLibs/<abi>/ and generates
// the Kotlin bindings into src/main/uniffi/ (both generated, never committed).
// See README.md beside this file.

plugins {
    id("com.android.library")
    id("org.jetbrains.kotlin.android")
    `maven-publish`
}

// The version is written once, in the workspace Cargo.toml
// ([workspace.package] version); the AAR, the wheel and the Swift release
// all carry that one.
val toolledgerVersion: String = file("../../Cargo.toml").readLines()
    .dropWhile { it.trim() != "[workspace.package]" }
    .drop(1)
    .takeWhile { !it.trim().startsWith("[") }
    .firstNotNullOfOrNull { Regex("""^version\s*=\s*"([^"]+)"""").find(it.trim())?.groupValues?.get(1) }
    ?: error("no version in [workspace.package] of ../../Cargo.toml")

group = "dev.toolledger"
version = toolledgerVersion

android {
    namespace = "dev.toolledger"
    compileSdk = 35

    defaultConfig {
        minSdk = 24
        // R8 keep rules for JNA and the generated bindings, applied to every
        // app that depends on this module.
        consumerProguardFiles("consumer-rules.pro")
        ndk {
            // The ABIs build-rust.sh produces.
            abiFilters += listOf("arm64-v8a", "armeabi-v7a", "x86_64", "x86")
        }
    }

    sourceSets {
        getByName("main") {
            // The generated UniFFI Kotlin file (dev/toolledger/toolledger.kt),
            // written by build-rust.sh. A java source dir is compiled by the
            // Kotlin plugin as well.
            java.srcDir("src/main/uniffi")
            // The hand-written layer (package dev.toolledger.ktx: suspend
            // ledger calls on Dispatchers.IO, Int/Long surface, Tool base
            // class), shared with the desktop JVM jar and tested there.
            java.srcDir("../../bindings/kotlin/src/main/kotlin")
            // libtoolledger.so per ABI, written by cargo-ndk (the default
            // location, stated for clarity).
            jniLibs.srcDir("src/main/jniLibs")
        }
    }

    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }

    publishing {
        // The AAR of the release build, with a sources jar, for maven-publish.
        singleVariant("release") {
            withSourcesJar()
        }
    }

    packaging {
        jniLibs {
            // Keep .so files uncompressed and page-aligned in the APK (the
            // default since AGP 3.6 with minSdk >= 23); loaded in place.
            useLegacyPackaging = false
        }
    }
}

kotlin {
    compilerOptions {
        jvmTarget.set(org.jetbrains.kotlin.gradle.dsl.JvmTarget.JVM_17)
    }
}

dependencies {
    // JNA loads libtoolledger.so and marshals every call. The @aar carries
    // JNA's own libjnidispatch.so for the Android ABIs (the plain jar has
    // only desktop natives).
    implementation("net.java.dev.jna:jna:5.17.0@aar")
    // The generated code implements async exports and the foreign async
    // ToolHandler with kotlinx.coroutines; the ktx layer's public API takes
    // a CoroutineDispatcher, so it is part of this library's API.
    api("org.jetbrains.kotlinx:kotlinx-coroutines-core:1.10.2")
}

// `./gradlew :toolledger:publishReleasePublicationToBuildRepoRepository`
// writes dev/toolledger/toolledger-android/<version>/ under build/repo (a
// Maven repository directory to upload or to point an app at);
// `publishToMavenLocal` puts it in ~/.m2. Apps then depend on
// `implementation("dev.toolledger:toolledger-android:<version>")`; JNA comes
// with it as the `@aar` (type aar in the POM), kotlinx-coroutines as an API
// dependency.
publishing {
    publications {
        register<MavenPublication>("release") {
            groupId = "dev.toolledger"
            artifactId = "toolledger-android"
            version = toolledgerVersion
            afterEvaluate { from(components["release"]) }
            pom {
                name.set("toolledger")
                description.set("A durable on-device SQLite ledger that makes AI tool calls effectively once.")
                licenses {
                    license {
                        name.set("MIT")
                        url.set("https://opensource.org/licenses/MIT")
                    }
                    license {
                        name.set("Apache-2.0")
                        url.set("https://www.apache.org/licenses/LICENSE-2.0")
                    }
                }
            }
        }
    }
    repositories {
        maven {
            name = "buildRepo"
            url = uri(layout.buildDirectory.dir("repo"))
        }
    }
}
